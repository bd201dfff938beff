"""Whether a row's answer bits depend on the batch it rides in, on onnxruntime's CPU provider.

``python -m bench.invariance sweep`` runs every model of a repository (ensembles aside: their
steps are models of it) as the service opens it (``service.onnxrt.session_options``: all graph
optimisations, sequential execution), and under the other levels and modes, at several
intra-op thread counts. Each row of a pool is first run alone (batch 1); then every batch size
from 1 to the model's ``max_batch_size`` takes rows drawn at random from the pool (other
companions, other positions, each trial), and each row's answer is compared, bit for bit, with
its batch-1 answer. It prints one Markdown row per model and setting: rows compared, rows whose
bits differ, and the largest difference in float32 ULPs (the distance of the bit patterns).

``python -m bench.invariance cost`` times what ``batch_invariant`` (config.pbtxt, docs/serving.md)
costs a model's runs: batches of each size through ``Model.infer`` with it off, ``rows`` and
``pad``, the three taken in turn within each repeat, and the ratio to off reported (medians).
``python -m bench.invariance served`` does the same through the serving core (``DataPlane``,
dynamic batching, no HTTP): 64 clients at once, each sending one row after another, for a
few seconds per mode in turn; it reports requests per second and the ratio to off.
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import statistics
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import onnxruntime as ort

from contract.model_config import ModelConfig
from contract.names import CONFIG_FILENAME, MODEL_FILENAME
from service.dataplane import DataPlane
from service.inference import InferenceRequest, RequestInput
from service.onnxrt import OnnxRuntime, SessionFactory, session_options
from service.repository.layout import load_version, read_config, version_dirs
from service.runtime import Model
from service.settings import Settings

CPU = ["CPUExecutionProvider"]
LEVELS = {
    "all": ort.GraphOptimizationLevel.ORT_ENABLE_ALL,
    "basic": ort.GraphOptimizationLevel.ORT_ENABLE_BASIC,
    "disabled": ort.GraphOptimizationLevel.ORT_DISABLE_ALL,
}
MODES = {"sequential": ort.ExecutionMode.ORT_SEQUENTIAL, "parallel": ort.ExecutionMode.ORT_PARALLEL}


@dataclass(frozen=True)
class Setting:
    """How a session is opened: intra-op threads (0: onnxruntime's default, one per core),
    graph optimisation level and execution mode."""

    threads: int
    level: str = "all"
    mode: str = "sequential"

    def options(self) -> ort.SessionOptions:
        """The service's session options, with this level and mode."""
        options = session_options(self.threads, 1)
        options.graph_optimization_level = LEVELS[self.level]
        options.execution_mode = MODES[self.mode]
        return options


@dataclass
class Finding:
    """What one model under one setting gave."""

    model: str
    setting: Setting
    rows: int = 0
    differing: int = 0
    worst_ulp: int = 0


def ulp_distance(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Per element, how many float32 values lie between ``a`` and ``b`` (0: the same bits,
    or +0 and -0); NaN patterns compare by their bits too."""
    ia = a.astype(np.float32).view(np.int32).astype(np.int64)
    ib = b.astype(np.float32).view(np.int32).astype(np.int64)
    # Map the sign-magnitude patterns onto one ordered line.
    ia = np.where(ia < 0, -(ia & 0x7FFFFFFF), ia)
    ib = np.where(ib < 0, -(ib & 0x7FFFFFFF), ib)
    return np.abs(ia - ib)


def models(repository: Path) -> Iterator[tuple[str, ModelConfig, bytes]]:
    """Each model's name, config and highest version's file (ensembles left out)."""
    for folder in sorted(p for p in repository.iterdir() if (p / CONFIG_FILENAME).is_file()):
        config = read_config(folder)
        versions = version_dirs(folder)
        if not versions or not (folder / str(max(versions)) / MODEL_FILENAME).is_file():
            continue
        yield folder.name, config, (folder / str(max(versions)) / MODEL_FILENAME).read_bytes()


def pool(config: ModelConfig, size: int, seed: int) -> dict[str, np.ndarray]:
    """``size`` rows of every input: uniform in [0, 1) (the digits' scaled pixels' range)."""
    rng = np.random.default_rng(seed)
    return {
        t.name: rng.random((size, *(d if d > 0 else 1 for d in t.dims))).astype(t.numpy_dtype)
        for t in config.inputs
    }


def sweep_one(
    name: str, config: ModelConfig, model: bytes, setting: Setting, trials: int, seed: int
) -> Finding:
    """Every batch size 1..max_batch_size, ``trials`` batches each, against batch-1 answers."""
    session = ort.InferenceSession(model, sess_options=setting.options(), providers=CPU)
    largest = config.max_batch_size
    rows = pool(config, 2 * largest, seed)
    count = len(next(iter(rows.values())))
    outputs = [o.name for o in config.outputs]
    alone = [session.run(outputs, {n: a[i : i + 1] for n, a in rows.items()}) for i in range(count)]
    stacked = [np.concatenate([one[k] for one in alone]) for k in range(len(outputs))]
    finding = Finding(name, setting)
    rng = np.random.default_rng(seed + 1)
    for size in range(1, largest + 1):
        for _ in range(trials):
            chosen = rng.choice(count, size, replace=False)
            got = session.run(outputs, {n: a[chosen] for n, a in rows.items()})
            # Per row, its worst element over every output.
            worst = np.max(
                [ulp_distance(g, s[chosen]).reshape(size, -1).max(axis=1)
                 for g, s in zip(got, stacked, strict=True)],
                axis=0,
            )  # fmt: skip
            finding.rows += size
            finding.differing += int(np.count_nonzero(worst))
            finding.worst_ulp = max(finding.worst_ulp, int(worst.max()))
    return finding


def sweep(args: argparse.Namespace) -> None:
    settings = [Setting(t) for t in args.threads]
    settings += [Setting(t, level) for t in args.threads for level in ("basic", "disabled")]
    settings += [Setting(t, "all", "parallel") for t in args.threads]
    print(f"onnxruntime {ort.__version__}, {args.trials} batches of each size per setting\n")
    print("| model | intra-op threads | optimisation | mode | rows | differing | worst ULP |")
    print("|---|---|---|---|---|---|---|")
    for name, config, model in models(args.repository):
        for setting in settings:
            found = sweep_one(name, config, model, setting, args.trials, args.seed)
            threads = setting.threads or "default"
            print(
                f"| {name} | {threads} | {setting.level} | {setting.mode} | {found.rows} | "
                f"{found.differing} | {found.worst_ulp} |",
                flush=True,
            )


def loaded(repository: Path, name: str, invariant: str) -> Model:
    """``name``'s highest version on one CPU thread, with ``batch_invariant`` as given."""
    sessions = SessionFactory(CPU, session_options(1, 1), False)
    folder = repository / name
    config = replace(read_config(folder), batch_invariant=invariant)
    return load_version(folder, max(version_dirs(folder)), config, OnnxRuntime(sessions), 1)


def cost(args: argparse.Namespace) -> None:
    modes = ("", "rows", "pad")
    versions = {mode: loaded(args.repository, args.model, mode) for mode in modes}
    feeds = {size: versions[""].example_feed(size) for size in args.sizes}
    print(f"{args.model}, one intra-op thread, median of {args.repeats} turns of {args.runs} runs")
    print("\n| batch | off µs/run | rows / off | pad / off |")
    print("|---|---|---|---|")
    for size, feed in feeds.items():
        taken: dict[str, list[float]] = {mode: [] for mode in modes}
        for _ in range(args.repeats):
            for mode in modes:  # in turn, so drift in the machine's speed falls on all three
                infer = versions[mode].infer
                began = time.perf_counter()
                for _ in range(args.runs):
                    infer(feed)
                taken[mode].append((time.perf_counter() - began) / args.runs)
        off, rows, pad = (statistics.median(taken[m]) for m in modes)
        print(f"| {size} | {off * 1e6:.1f} | {rows / off:.2f} | {pad / off:.2f} |", flush=True)


def _copies(repository: Path, name: str, root: Path, modes: tuple[str, ...]) -> None:
    """``name`` copied into ``root`` once per mode, as ``NAME-MODE`` with that setting."""
    for mode in modes:
        folder = root / f"{name}-{mode}"
        shutil.copytree(repository / name, folder)
        invariant = "" if mode == "off" else mode
        config = replace(
            read_config(repository / name), name=folder.name, batch_invariant=invariant
        )
        (folder / CONFIG_FILENAME).write_text(config.to_pbtxt())


async def _drive(core: DataPlane, name: str, clients: int, seconds: float, row: np.ndarray) -> int:
    """Requests answered in ``seconds`` by ``clients`` coroutines, each one after another."""
    end = time.perf_counter() + seconds
    answered = 0

    async def client() -> None:
        nonlocal answered
        while time.perf_counter() < end:
            await core.infer(name, None, InferenceRequest([RequestInput(row, "input", "FP32")]))
            answered += 1

    await asyncio.gather(*(client() for _ in range(clients)))
    return answered


async def _served(args: argparse.Namespace, root: Path) -> None:
    modes = ("off", "rows", "pad")
    _copies(args.repository, args.model, root, modes)
    settings = Settings(model_repository=root, grpc_port=0, compile_activations=False)
    core = DataPlane(settings)
    await core.start()
    try:
        row = pool(read_config(root / f"{args.model}-off"), 1, 0)["input"]
        counts: dict[str, list[float]] = {mode: [] for mode in modes}
        for _ in range(args.repeats):
            for mode in modes:  # in turn, so drift in the machine's speed falls on all three
                done = await _drive(core, f"{args.model}-{mode}", args.clients, args.seconds, row)
                counts[mode].append(done / args.seconds)
    finally:
        await core.stop()
    off = statistics.median(counts["off"])
    print(f"{args.model}, {args.clients} clients of one row each, median of {args.repeats} turns "
          f"of {args.seconds} s\n")  # fmt: skip
    print("| batch_invariant | requests/s | ratio to off |")
    print("|---|---|---|")
    for mode in modes:
        rate = statistics.median(counts[mode])
        print(f"| {mode} | {rate:.0f} | {rate / off:.2f} |")


def served(args: argparse.Namespace) -> None:
    with tempfile.TemporaryDirectory() as root:
        asyncio.run(_served(args, Path(root)))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    first = commands.add_parser("sweep", help="rows' bits across batch sizes and companions")
    first.add_argument("--repository", type=Path, default=Path("model_repository"))
    first.add_argument("--threads", type=lambda s: [int(t) for t in s.split(",")],
                       default=[1, 2, 0], help="intra-op thread counts (0: default)")  # fmt: skip
    first.add_argument("--trials", type=int, default=2)
    first.add_argument("--seed", type=int, default=0)
    first.set_defaults(run=sweep)
    second = commands.add_parser("cost", help="what batch_invariant costs a model's runs")
    second.add_argument("--repository", type=Path, default=Path("model_repository"))
    second.add_argument("--model", default="digits-mlp")
    second.add_argument("--sizes", type=lambda s: [int(t) for t in s.split(",")],
                        default=[1, 8, 64, 256])  # fmt: skip
    second.add_argument("--runs", type=int, default=200)
    second.add_argument("--repeats", type=int, default=7)
    second.set_defaults(run=cost)
    third = commands.add_parser("served", help="what batch_invariant costs served requests")
    third.add_argument("--repository", type=Path, default=Path("model_repository"))
    third.add_argument("--model", default="digits-mlp")
    third.add_argument("--clients", type=int, default=64)
    third.add_argument("--seconds", type=float, default=3.0)
    third.add_argument("--repeats", type=int, default=3)
    third.set_defaults(run=served)
    args = parser.parse_args(argv)
    args.run(args)


if __name__ == "__main__":
    main()
