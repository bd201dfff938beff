"""onnxruntime sessions for every model version in the repository: numpy in, numpy out.

This module knows nothing of HTTP. It loads ``<repo>/<model>/<version>/model.onnx``, checks each
session against its ``config.pbtxt``, detects a silent fallback from a requested execution
provider, and warms the session up.
"""

from __future__ import annotations

import logging
import statistics
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort

from contract.metadata import ModelMetadata
from contract.model_config import (
    ONNX_TO_V2,
    ConfigParseError,
    ModelConfig,
    TensorConfig,
    derive_model_config,
    load_model_config,
)
from contract.names import CONFIG_FILENAME, MODEL_FILENAME, PLATFORM
from service.errors import ModelLoadError

logger = logging.getLogger("gelu_serve")


def median_us(run: Callable[[], object], runs: int = 5) -> float:
    """The median time of ``runs`` calls of ``run``, in microseconds."""
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        run()
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e6


def largest_within(
    time_of: Callable[[int], float], budget_us: float, smallest: int, largest: int
) -> tuple[int, float]:
    """The largest size, doubling from ``smallest`` up to ``largest`` (or ``largest`` itself),
    that ``time_of(size)`` (µs) keeps within ``budget_us``, with its time; (0, the time of
    ``smallest``) if none. What runs on the event loop, for model batches and activations."""
    size, within, cost = smallest, 0, 0.0
    while True:
        took = time_of(size)
        if took > budget_us:
            return within, cost if within else took
        within, cost = size, took
        if size >= largest:
            return within, cost
        size = min(size * 2, largest)


def session_options(intra_op_threads: int, inter_op_threads: int) -> ort.SessionOptions:
    """Session options shared by model and activation sessions."""
    options = ort.SessionOptions()
    options.intra_op_num_threads = intra_op_threads
    options.inter_op_num_threads = inter_op_threads
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    options.log_severity_level = 3  # errors only; provider fallback is reported by us
    return options


class SessionFactory:
    """Creates onnxruntime sessions on the configured providers and reports fallbacks once.

    onnxruntime silently falls back to CPU when a requested provider cannot load; compare what
    was asked for with what each session reports, log each missing provider once (not once per
    model and graph), and refuse under ``strict``.
    """

    def __init__(self, providers: list[str], options: ort.SessionOptions, strict: bool) -> None:
        self.providers = providers
        self.options = options
        self.strict = strict
        self._reported: set[str] = set()

    def create(self, source: str | bytes, label: str) -> tuple[ort.InferenceSession, list[str]]:
        """An InferenceSession for ``source`` (a path or serialized model) and the providers it
        really uses; ``ModelLoadError`` if it cannot load, or falls back under ``strict``."""
        try:
            with warnings.catch_warnings():
                # onnxruntime warns of a missing provider; the message below says it better.
                warnings.simplefilter("ignore", UserWarning)
                session = ort.InferenceSession(
                    source, sess_options=self.options, providers=self.providers
                )
        except Exception as exc:  # onnxruntime raises its own exception types
            reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            raise ModelLoadError(f"{label}: onnxruntime cannot load it: {reason}") from None
        in_use = session.get_providers()
        missing = [p for p in self.providers if p not in in_use]
        if missing and self.strict:
            raise ModelLoadError(
                f"{label}: requested execution provider(s) {', '.join(missing)} unavailable "
                f"(onnxruntime offers {', '.join(ort.get_available_providers())}); refusing to "
                "start (GELU_STRICT_PROVIDERS=true)"
            )
        for provider in missing:
            if provider not in self._reported:
                self._reported.add(provider)
                logger.warning(
                    "requested execution provider %s unavailable (onnxruntime offers %s); "
                    "running on %s",
                    provider,
                    ", ".join(ort.get_available_providers()),
                    ", ".join(in_use),
                )
        return session, in_use


@dataclass
class Model:
    """One version of one model, loaded and checked."""

    name: str
    version: str
    config: ModelConfig
    session: ort.InferenceSession
    providers: list[str]
    metadata: ModelMetadata
    output_names: list[str] = field(init=False)
    input_configs: dict[str, TensorConfig] = field(init=False)  # by name

    def __post_init__(self) -> None:
        self.output_names = [o.name for o in self.config.outputs]
        self.input_configs = {t.name: t for t in self.config.inputs}

    @property
    def task(self) -> str:
        return self.metadata.task

    @property
    def inputs(self) -> tuple[TensorConfig, ...]:
        return self.config.inputs

    def infer(
        self, inputs: dict[str, np.ndarray], outputs: list[str] | None = None
    ) -> dict[str, np.ndarray]:
        """Run the session on already validated inputs; blocks, so call it off the event loop."""
        names = outputs or self.output_names
        results = self.session.run(names, inputs)
        return dict(zip(names, results, strict=True))

    def example_feed(self, batch: int) -> dict[str, np.ndarray]:
        """Zeros of every input for a batch of ``batch`` (a model without a batch axis,
        ``max_batch_size: 0``, takes its dims as they are); -1 dims are given 1."""
        lead = (batch,) if self.config.max_batch_size else ()
        return {
            t.name: np.zeros((*lead, *(d if d >= 0 else 1 for d in t.dims)), t.numpy_dtype)
            for t in self.inputs
        }

    def warm_up(self, runs: int) -> None:
        """Run a few batches through the session so the first client pays no set-up cost."""
        for batch in (1, 8, 1, 8)[:runs]:
            self.infer(self.example_feed(batch))

    def time_run(self, batch: int, runs: int = 5) -> float:
        """The median time of one run on a batch of ``batch`` zeros, in microseconds."""
        feed = self.example_feed(batch)
        return median_us(lambda: self.infer(feed), runs)

    def largest_batch_within(self, budget_us: float, largest: int) -> tuple[int, float]:
        """The largest power-of-two batch up to ``largest`` (or ``largest`` itself) whose run
        takes at most ``budget_us``, timed here, with its time; (0, time of one) if none. A
        model without a batch axis runs one request at a time: 1 or 0."""
        largest = largest if self.config.max_batch_size else 1
        return largest_within(self.time_run, budget_us, 1, largest)

    def check_against_config(self) -> None:
        """The session's inputs and outputs must be exactly those ``config.pbtxt`` declares."""
        label = f"{self.name}/{self.version}"
        for kind, declared, actual in (
            ("input", self.config.inputs, self.session.get_inputs()),
            ("output", self.config.outputs, self.session.get_outputs()),
        ):
            skip = 1 if self.config.max_batch_size else 0  # the batch axis
            got = {
                a.name: (
                    ONNX_TO_V2.get(a.type, a.type),
                    tuple(d if isinstance(d, int) else -1 for d in a.shape[skip:]),
                )
                for a in actual
            }
            want = {d.name: (d.datatype, d.dims) for d in declared}
            if set(got) != set(want):
                raise ModelLoadError(
                    f"{label}: {kind}s in model.onnx {sorted(got)} != config.pbtxt {sorted(want)}"
                )
            for name, (datatype, dims) in want.items():
                if got[name][0] != datatype or not dims_match(got[name][1], dims):
                    raise ModelLoadError(
                        f"{label}: {kind} {name!r} is {got[name][0]} {list(got[name][1])} in "
                        f"model.onnx but {datatype} {list(dims)} in config.pbtxt"
                    )


def dims_match(actual: tuple[int, ...], declared: tuple[int, ...]) -> bool:
    """Shapes agree: same rank, and equal wherever both are known (-1: any size)."""
    return len(actual) == len(declared) and all(
        a == d or a == -1 or d == -1 for a, d in zip(actual, declared, strict=True)
    )


def model_names(root: Path) -> list[str]:
    """The models a repository holds: its directories (export's ``.staging`` ones aside)."""
    return sorted(p.name for p in root.iterdir() if p.is_dir() and not p.name.startswith("."))


def read_config(
    model_dir: Path, complete: Callable[[Path], ModelConfig] | None = None
) -> ModelConfig:
    """A model's ``config.pbtxt``, checked against its directory; ``ModelLoadError`` if not.
    Without the file, ``complete`` (when given) derives one from the model itself."""
    config_path = model_dir / CONFIG_FILENAME
    try:
        if complete is not None and not config_path.exists():
            return complete(model_dir)
        config = load_model_config(config_path.read_text())
    except (OSError, ConfigParseError) as exc:
        raise ModelLoadError(f"{config_path}: {exc}") from None
    if config.name != model_dir.name:
        raise ModelLoadError(f"{config_path}: name {config.name!r} != directory name")
    if config.platform != PLATFORM:
        raise ModelLoadError(f"{config_path}: platform {config.platform!r} is not served")
    return config


_skipped: set[Path] = set()  # version directories already warned about


def version_dirs(model_dir: Path) -> dict[int, Path]:
    """A model's version directories by number. As Triton, a version is a positive integer;
    any other directory is skipped with a warning (once)."""
    versions: dict[int, Path] = {}
    for path in model_dir.iterdir():
        if not path.is_dir():
            continue
        if path.name.isascii() and path.name.isdigit() and int(path.name) > 0:
            versions[int(path.name)] = path
        elif path not in _skipped:
            _skipped.add(path)
            logger.warning("%s: not a version (a positive integer): skipped", path)
    return versions


def signature(model_dir: Path, version: int) -> tuple[int, ...]:
    """What changes when a version's files change: size and modification time of its
    ``model.onnx`` and of the model's ``config.pbtxt`` (when it has one)."""
    config = model_dir / CONFIG_FILENAME
    paths = [config] if config.exists() else []
    stats = [p.stat() for p in [*paths, model_dir / str(version) / MODEL_FILENAME]]
    return tuple(x for st in stats for x in (st.st_size, st.st_mtime_ns))


def config_completer(
    sessions: SessionFactory, default_max_batch_size: int
) -> Callable[[Path], ModelConfig]:
    """What derives a model's config from its highest version's ONNX file, as Triton's
    auto-complete does (see ``contract.model_config.derive_model_config``)."""

    def specs(tensors: list[Any]) -> list[tuple[str, str, list[Any]]]:
        return [(t.name, t.type, list(t.shape)) for t in tensors]

    def complete(model_dir: Path) -> ModelConfig:
        versions = version_dirs(model_dir)
        if not versions:
            raise ModelLoadError(f"{model_dir}: no config.pbtxt, and no version to derive it from")
        path = versions[max(versions)] / MODEL_FILENAME
        session, _ = sessions.create(str(path), f"{model_dir.name}/{max(versions)}")
        config = derive_model_config(
            model_dir.name,
            specs(session.get_inputs()),
            specs(session.get_outputs()),
            default_max_batch_size,
        )
        logger.info("%s: no config.pbtxt; derived from %s", model_dir.name, path)
        return config

    return complete


def load_version(
    model_dir: Path, version: int, config: ModelConfig, sessions: SessionFactory, warmup_runs: int
) -> Model:
    """One version loaded, checked against ``config`` and warmed; ``ModelLoadError`` if not.
    Blocks: call it off the event loop."""
    label = f"{model_dir.name}/{version}"
    session, in_use = sessions.create(str(model_dir / str(version) / MODEL_FILENAME), label)
    try:
        meta = ModelMetadata.from_props(session.get_modelmeta().custom_metadata_map)
    except ValueError as exc:
        raise ModelLoadError(f"{label}: unreadable metadata_props: {exc}") from None
    model = Model(model_dir.name, str(version), config, session, in_use, meta)
    model.check_against_config()
    model.warm_up(warmup_runs)
    logger.info("loaded %s on %s", label, ", ".join(in_use))
    return model
