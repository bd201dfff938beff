"""The first hour of two revisions, timed side by side on one host: ``python -m workbench.timing``
(``make workbench``).

Every measurement starts from a fresh ``git clone`` of this repository checked out at the
revision, and the two revisions take turns (which goes first alternates), so that whatever the
host does meanwhile falls on both. Steps (``--steps``):

- ``run-warm``: ``make run`` until ``GET /v2/health/ready`` answers 200 (install, the default
  models, the server's start), the installers' caches warm: ``OUT/cache``, filled by a first
  untimed ``make run`` of each revision (``--no-prime`` skips it when they are already full);
- ``run-cold``: the same with ``PIP_CACHE_DIR`` and ``UV_CACHE_DIR`` empty directories;
- ``test``: ``make test``;
- ``ci``: ``.ci/run``, once, its parts read from its output: ``make test`` up to
  ``docker/e2e.sh``'s first line (``== 1. tools``), the e2e run after it.

Raw results go to ``OUT/results.json`` (rewritten after each measurement), logs to
``OUT/logs/``, and a markdown table with the host, date and commands to ``OUT/workbench.md``
(for docs/workbench.md). Run it on a quiet host; the whole comparison takes about an hour.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import IO

ROOT = Path(__file__).resolve().parents[1]
STEPS = ("run-warm", "run-cold", "test", "ci")
# The targets: new time at most this share of the old's.
TARGETS = {"run-warm": 0.30, "run-cold": 0.40, "test": 0.70, "ci": 0.70, "ci: make test": 0.70}
READY_PATH = "/v2/health/ready"
E2E_START = re.compile(r"^== 1\. tools")
# Lines make echoes as it starts each part: where the time went, read from the log.
MARKS = {
    "models": re.compile(r"gelu-serve models"),
    "serve": re.compile(r"gelu-serve serve"),
    "lint": re.compile(r"bin/ruff check"),
    "typecheck": re.compile(r"bin/mypy"),
    "pytest": re.compile(r"bin/pytest"),
    "e2e": E2E_START,
}
# Variables of the shell this runs in that must not reach the clones' makes and venvs.
DROPPED = ("VIRTUAL_ENV", "MAKEFLAGS", "MAKELEVEL", "MFLAGS", "MAKEOVERRIDES", "PYTHONPATH")


@dataclass
class Measurement:
    """One step of one revision, from its fresh clone."""

    step: str
    label: str  # "old" or "new"
    revision: str
    round: int
    seconds: float
    ok: bool
    parts: dict[str, float] = field(default_factory=dict)  # seconds from the start of each part
    log: str = ""
    # The host's 1-minute load average as the step started and ended: other work on the host
    # falls on both revisions only roughly, so the figures are read beside it.
    load: list[float] = field(default_factory=list)


def free_port() -> int:
    """A TCP port nothing listens on now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def clean_environment(base: Mapping[str, str]) -> dict[str, str]:
    """``base`` without an activated venv or a parent make's variables."""
    env = {k: v for k, v in base.items() if k not in DROPPED}
    venv = base.get("VIRTUAL_ENV")
    if venv:
        paths = env.get("PATH", "").split(os.pathsep)
        env["PATH"] = os.pathsep.join(p for p in paths if not p.startswith(venv))
    return env


def resolve(repository: Path, revision: str) -> str:
    """The full hash of ``revision`` in ``repository``."""
    done = subprocess.run(
        ["git", "rev-parse", "--verify", f"{revision}^{{commit}}"],
        cwd=repository, capture_output=True, text=True, check=True,
    )  # fmt: skip
    return done.stdout.strip()


def clone(repository: Path, revision: str, into: Path) -> None:
    """A fresh clone of ``repository`` at ``revision``, detached."""
    shutil.rmtree(into, ignore_errors=True)
    subprocess.run(["git", "clone", "--quiet", str(repository), str(into)], check=True)
    subprocess.run(["git", "checkout", "--quiet", "--detach", revision], cwd=into, check=True)


class Log:
    """A command's output, each line stamped with seconds since the start; marks the first
    line matching each of ``MARKS``."""

    def __init__(self, path: Path, start: float) -> None:
        self.path, self.start = path, start
        self.parts: dict[str, float] = {}
        path.parent.mkdir(parents=True, exist_ok=True)
        self.file: IO[str] = path.open("w")

    def follow(self, stream: IO[str]) -> None:
        """Copy ``stream`` to the log until it ends."""
        for line in stream:
            at = time.monotonic() - self.start
            self.file.write(f"{at:8.2f} {line}")
            self.file.flush()
            for name, pattern in MARKS.items():
                if name not in self.parts and pattern.search(line):
                    self.parts[name] = round(at, 2)

    def close(self) -> None:
        self.file.close()


def ready(port: int) -> bool:
    """Whether the service on ``port`` answers 200 at ``READY_PATH``."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{READY_PATH}", timeout=1) as r:
            return bool(r.status == 200)
    except (OSError, urllib.error.URLError):
        return False


@contextmanager
def started(
    command: list[str], cwd: Path, env: dict[str, str], log: Log
) -> Iterator[subprocess.Popen[str]]:
    """``command`` in its own process group, its output followed into ``log`` by a thread;
    the whole group stopped (TERM, then KILL) on leaving."""
    import threading

    process = subprocess.Popen(
        command, cwd=cwd, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT, text=True, start_new_session=True,
    )  # fmt: skip
    assert process.stdout is not None
    reader = threading.Thread(target=log.follow, args=(process.stdout,), daemon=True)
    reader.start()
    try:
        yield process
    finally:
        for sig, wait in ((signal.SIGTERM, 30.0), (signal.SIGKILL, 10.0)):
            if process.poll() is not None:
                break
            try:
                os.killpg(process.pid, sig)
                process.wait(wait)
            except (ProcessLookupError, subprocess.TimeoutExpired):
                pass
        reader.join(10)
        log.close()


def time_run(
    clone_dir: Path, env: dict[str, str], log_path: Path, limit: float
) -> tuple[float, bool, dict[str, float]]:
    """``make run`` on a free port until ready: (seconds, answered, parts)."""
    port = free_port()
    env = {**env, "GELU_GRPC_PORT": str(free_port())}
    start = time.monotonic()
    log = Log(log_path, start)
    with started(["make", "run", f"PORT={port}"], clone_dir, env, log) as process:
        while time.monotonic() - start < limit and process.poll() is None:
            if ready(port):
                return time.monotonic() - start, True, log.parts
            time.sleep(0.2)
    return time.monotonic() - start, False, log.parts


def time_command(
    command: list[str], clone_dir: Path, env: dict[str, str], log_path: Path, limit: float
) -> tuple[float, bool, dict[str, float]]:
    """``command`` to its end: (seconds, exit status 0, parts)."""
    start = time.monotonic()
    log = Log(log_path, start)
    with started(command, clone_dir, env, log) as process:
        try:
            code = process.wait(limit)
        except subprocess.TimeoutExpired:
            code = -1
    return time.monotonic() - start, code == 0, log.parts


@dataclass
class Plan:
    """What to run, and where."""

    repository: Path
    revisions: dict[str, str]  # label -> full hash
    steps: tuple[str, ...]
    rounds: int
    out: Path
    limit: float
    keep: bool
    env: dict[str, str]


def measure(plan: Plan, step: str, label: str, round_: int) -> Measurement:
    """One step of one revision from a fresh clone; the clone is removed after, unless kept."""
    revision = plan.revisions[label]
    name = f"{step}-{label}-{round_}"
    clone_dir = plan.out / "clones" / name
    clone(plan.repository, revision, clone_dir)
    env = dict(plan.env)
    scratch = None
    if step in ("run-warm", "prime"):
        env |= {"PIP_CACHE_DIR": str(plan.out / "cache" / "pip"),
                "UV_CACHE_DIR": str(plan.out / "cache" / "uv")}  # fmt: skip
    elif step == "run-cold":
        scratch = Path(tempfile.mkdtemp(prefix="cold-", dir=plan.out))
        env |= {"PIP_CACHE_DIR": str(scratch / "pip"), "UV_CACHE_DIR": str(scratch / "uv")}
    log_path = plan.out / "logs" / f"{name}.log"
    load = [os.getloadavg()[0]]
    try:
        if step in ("run-warm", "run-cold", "prime"):
            seconds, ok, parts = time_run(clone_dir, env, log_path, plan.limit)
        else:
            command = ["make", "test"] if step == "test" else [".ci/run"]
            seconds, ok, parts = time_command(command, clone_dir, env, log_path, plan.limit)
    finally:
        if scratch is not None:
            shutil.rmtree(scratch, ignore_errors=True)
        if not plan.keep:
            shutil.rmtree(clone_dir, ignore_errors=True)
    load.append(os.getloadavg()[0])
    result = Measurement(step, label, revision, round_, round(seconds, 2), ok, parts, str(log_path),
                         [round(x, 2) for x in load])  # fmt: skip
    print(f"{step:9} {label} ({revision[:9]}) round {round_}: {seconds:7.1f} s"
          f"{'' if ok else '  FAILED'}  load {load[0]:.1f}-{load[1]:.1f}  {parts}",
          flush=True)  # fmt: skip
    return result


def order(labels: tuple[str, str], step_index: int, round_: int) -> tuple[str, str]:
    """Which revision goes first: alternating with each step and each round."""
    return labels if (step_index + round_) % 2 == 0 else (labels[1], labels[0])


def ci_parts(measurement: Measurement) -> dict[str, float]:
    """A ``ci`` measurement's parts: ``make test`` up to e2e's first line, the e2e after it."""
    e2e = measurement.parts.get("e2e")
    if e2e is None:
        return {}
    return {"ci: make test": e2e, "ci: docker/e2e.sh": round(measurement.seconds - e2e, 2)}


def rows(results: list[Measurement]) -> list[tuple[str, float | None, float | None, int]]:
    """(step, old median seconds, new median seconds, pairs) for each step measured."""
    table: dict[str, dict[str, list[float]]] = {}
    for m in results:
        if m.step == "prime" or not m.ok:
            continue
        values = {m.step: m.seconds, **(ci_parts(m) if m.step == "ci" else {})}
        for step, seconds in values.items():
            table.setdefault(step, {"old": [], "new": []})[m.label].append(seconds)
    out = []
    for step, by_label in table.items():
        old, new = by_label["old"], by_label["new"]
        out.append((step, statistics.median(old) if old else None,
                    statistics.median(new) if new else None, min(len(old), len(new))))  # fmt: skip
    return out


def host() -> dict[str, object]:
    """The machine: CPU model, usable cores, memory, kernel, Python."""
    model = ""
    with open("/proc/cpuinfo") as cpuinfo:
        for line in cpuinfo:
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    with open("/proc/meminfo") as meminfo:
        memory_kb = int(meminfo.readline().split()[1])
    return {
        "cpu": model,
        "cores": len(os.sched_getaffinity(0)),
        "memory_gib": round(memory_kb / 2**20, 1),
        "kernel": platform.release(),
        "python": platform.python_version(),
        "loadavg_start": os.getloadavg()[0],
    }


def floor(seconds: float = 10.0) -> float | None:
    """The FastAPI floor (``bench.floor``, served as the service serves) on CPU 1, driven by
    wrk on CPU 0 at c=64 for ``seconds``: requests/s, or None without wrk, two CPUs or
    FastAPI in this Python."""
    if shutil.which("wrk") is None or len(os.sched_getaffinity(0)) < 2:
        return None
    port = free_port()
    server = subprocess.Popen(
        ["taskset", "-c", "1", sys.executable, "-m", "bench.floor", "--http", str(port)],
        cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        for _ in range(100):
            time.sleep(0.2)
            if server.poll() is not None:
                return None
            with socket.socket() as s:
                if s.connect_ex(("127.0.0.1", port)) == 0:
                    break
        with tempfile.NamedTemporaryFile("w", suffix=".lua") as script:
            script.write('wrk.method = "POST"\nwrk.body = "{}"\n')
            script.flush()
            done = subprocess.run(
                ["taskset", "-c", "0", "wrk", "-t1", "-c64", f"-d{seconds:g}s", "-s",
                 script.name, f"http://127.0.0.1:{port}/floor"],
                capture_output=True, text=True,
            )  # fmt: skip
        found = re.search(r"Requests/sec:\s+([\d.]+)", done.stdout)
        return float(found.group(1)) if found else None
    finally:
        server.terminate()
        server.wait(10)


def markdown(report: dict[str, object], results: list[Measurement]) -> str:
    """docs/workbench.md's table: the host, the date, the commands and each step's figures."""
    info = report["host"]
    assert isinstance(info, dict)
    revisions = report["revisions"]
    assert isinstance(revisions, dict)
    floor_rps = report.get("floor_rps")
    lines = [
        f"Measured {report['date']} on {info['cpu']}, {info['cores']} cores, "
        f"{info['memory_gib']} GiB, Linux {info['kernel']}, Python {info['python']}; "
        + (f"the host's FastAPI floor (one pinned core, c=64) {floor_rps:,.0f} requests/s."
           if isinstance(floor_rps, float) else "the host's FastAPI floor not measured."),
        f"Old: `{revisions['old'][:9]}`, new: `{revisions['new'][:9]}`, each from a fresh "
        f"`git clone`, taking turns; command: `{report['command']}`.",
        "",
        "| step | old (s) | new (s) | new / old | target | pairs | load |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]  # fmt: skip
    for step, old, new, pairs in rows(results):
        ratio = new / old if old and new else None
        target = TARGETS.get(step)
        verdict = "" if ratio is None or target is None else (" met" if ratio <= target else
                                                              " MISSED")  # fmt: skip
        lines.append(
            f"| {step} | {_seconds(old)} | {_seconds(new)} | "
            f"{'' if ratio is None else f'{ratio:.2f}'} | "
            f"{'' if target is None else f'<= {target:.2f}'}{verdict} | {pairs} | "
            f"{load_range(results, step.split(':')[0])} |"
        )
    failed = [m for m in results if not m.ok]
    for m in failed:
        lines.append(f"\n{m.step} of {m.label} (round {m.round}) failed after {m.seconds} s: "
                     f"see {m.log}.")  # fmt: skip
    return "\n".join(lines) + "\n"


def load_range(results: list[Measurement], step: str) -> str:
    """The least and most 1-minute load average seen at the start and end of ``step``'s
    successful measurements: ``2.1-6.3``."""
    loads = [x for m in results if m.step == step and m.ok for x in m.load]
    return f"{min(loads):.1f}-{max(loads):.1f}" if loads else ""


def _seconds(value: float | None) -> str:
    return "" if value is None else f"{value:.1f}"


def write(plan: Plan, report: dict[str, object], results: list[Measurement]) -> None:
    """OUT/results.json and OUT/workbench.md, as measured so far."""
    report["measurements"] = [asdict(m) for m in results]
    (plan.out / "results.json").write_text(json.dumps(report, indent=2) + "\n")
    (plan.out / "workbench.md").write_text(markdown(report, results))


def run(plan: Plan, prime: bool, measure_floor: bool) -> list[Measurement]:
    """Every step of both revisions, ``plan.rounds`` times, taking turns."""
    report: dict[str, object] = {
        "date": datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "command": " ".join(["python -m workbench.timing", *sys.argv[1:]]),
        "revisions": plan.revisions,
        "host": host(),
        "floor_rps": floor() if measure_floor else None,
    }
    results: list[Measurement] = []
    labels = ("old", "new")
    if prime and "run-warm" in plan.steps:
        for label in labels:
            results.append(measure(plan, "prime", label, 0))
            write(plan, report, results)
    for round_ in range(1, plan.rounds + 1):
        for index, step in enumerate(plan.steps):
            for label in order(labels, index, round_):
                results.append(measure(plan, step, label, round_))
                write(plan, report, results)
    return results


def parse(argv: list[str] | None) -> argparse.Namespace:
    """The command line."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--old", default="0cc1e33", help="the revision to compare against")
    parser.add_argument("--new", default="HEAD", help="the revision measured (default: HEAD)")
    parser.add_argument("--steps", default=",".join(STEPS), help=f"of {', '.join(STEPS)}")
    parser.add_argument("--rounds", type=int, default=1, help="pairs of each step (default 1)")
    parser.add_argument("--out", type=Path, default=None, help="default: runs/workbench-<date>")
    parser.add_argument("--repository", type=Path, default=ROOT, help="the repository cloned")
    parser.add_argument("--limit", type=float, default=3600, help="seconds a step may take")
    parser.add_argument("--keep", action="store_true", help="keep the clones")
    parser.add_argument("--no-prime", action="store_true", help="the caches in OUT are warm")
    parser.add_argument("--no-floor", action="store_true", help="skip the FastAPI floor")
    args = parser.parse_args(argv)
    unknown = set(args.steps.split(",")) - set(STEPS)
    if unknown:
        parser.error(f"unknown steps {sorted(unknown)}; choose from {', '.join(STEPS)}")
    return args


def main(argv: list[str] | None = None) -> None:
    """Measure as asked; print where the results are."""
    args = parse(argv)
    out: Path = args.out or ROOT / "runs" / f"workbench-{datetime.now(UTC):%Y%m%d-%H%M}"
    out.mkdir(parents=True, exist_ok=True)
    repository = args.repository.resolve()
    plan = Plan(
        repository=repository,
        revisions={"old": resolve(repository, args.old), "new": resolve(repository, args.new)},
        steps=tuple(s for s in STEPS if s in args.steps.split(",")),
        rounds=args.rounds,
        out=out.resolve(),
        limit=args.limit,
        keep=args.keep,
        env=clean_environment(os.environ),
    )
    run(plan, prime=not args.no_prime, measure_floor=not args.no_floor)
    print(f"wrote {plan.out / 'results.json'} and {plan.out / 'workbench.md'}")


if __name__ == "__main__":
    main()
