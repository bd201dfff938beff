"""The live model repository: which model versions serve, and how they change while serving.

As Triton's model repository manager: ``load(name)`` reads the model's ``config.pbtxt``, picks
the versions its ``version_policy`` names, and loads, checks and warms each new or changed
version off the event loop, reusing those whose files have not changed. Only then does the new
set take new requests, in one assignment on the loop; a version it replaces (or that is gone)
is retired: it finishes its in-flight and queued requests, then its scheduler and session
are released. A version that fails to load leaves what was serving untouched and is reported as
``UNAVAILABLE`` with the reason (``index()``, a log line, a metric). ``unload(name)`` retires
every version. ``poll_forever()`` re-scans the repository and acts on a model whose files have
changed only once two scans in a row agree, so a file still being copied is never loaded.

One model's failure is that model's (issue 62, item 3): every error of a load, of any type (a
config the parser chokes on, an ``OSError``, a ``RecursionError``, onnxruntime's own exceptions,
a ``MemoryError``), becomes that version's refusal, ``ModelLoadError`` with its reason, logged
as one line and kept for the index; start-up (``GELU_EXIT_ON_ERROR=false``), the poller and the
other models go on. A refusal names the model's files from the repository's root, never where
the repository lies on disk (issue 62, item 9; Triton's CVE-2023-31036 was a load API that
reached paths outside its repository): only the log line names the root.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import anyio.to_thread

from contract.model_config import ModelConfig
from contract.names import CONFIG_FILENAME
from service.batching import Runs, Scheduler
from service.errors import ModelLoadError, NotFoundError, first_line
from service.inference import ModelInfo, TensorInfo
from service.metrics import Metrics, QueueSample
from service.repository.layout import (
    config_completer,
    load_version,
    model_names,
    read_config,
    signature,
    version_dirs,
)
from service.runtime import Model, Runtime
from service.settings import Settings
from service.signing import Verifier

logger = logging.getLogger("gelu_serve")

READY, UNAVAILABLE = "READY", "UNAVAILABLE"
Scan = dict[int, tuple[int, ...] | None]  # version -> file signature (None: unreadable)
# A model name is one directory entry: longer ones are refused without asking the disk.
NAME_MAX = 255
# The repository index reads at most this many entries of the repository's directory.
INDEX_MAX = 10_000


@dataclass(eq=False)
class Served:
    """One model version taking requests: its model, its scheduler (every way its requests
    run), and its requests in flight."""

    model: Model
    scheduler: Scheduler
    signature: tuple[int, ...]
    runs: Runs  # the scheduler's: what its runs and requests count
    info: ModelInfo | None = None
    in_flight: int = 0  # requests taken and not yet answered: running or queued
    retired: bool = False
    last_used: int = field(default_factory=time.perf_counter_ns)  # its last request's arrival
    drained: asyncio.Event = field(default_factory=asyncio.Event)
    on_idle: Callable[[], object] | None = None  # told when its last request in flight ends

    @property
    def memory_bytes(self) -> int:
        """What its session holds: the resident memory it added as it opened, never less than
        its model file (``signature`` ends with its size and time), as a session opened in
        memory freed by another adds nothing to the process's."""
        return max(self.model.session.memory_bytes, self.signature[-2])

    def finished(self) -> None:
        """One request of this version is done (``in_flight`` was raised for it when it
        arrived, before any ``await``); a retired version that has no more can be released,
        and one still serving is idle: on_demand may unload it to make room (issue 62, item
        7: a version with requests in flight or queued is never unloaded to make room)."""
        self.in_flight -= 1
        if not self.in_flight:
            if self.retired:
                self.drained.set()
            elif self.on_idle is not None:
                self.on_idle()


@dataclass(frozen=True)
class VersionState:
    """A version's state for the repository index."""

    state: str
    reason: str = ""


class ModelRepository:
    """Every model version serving from one repository root; all state lives on the loop."""

    def __init__(self, settings: Settings, runtime: Runtime, metrics: Metrics) -> None:
        self.root = settings.model_repository
        self.settings = settings
        self.runtime = runtime
        self.metrics = metrics
        self._serving: dict[str, dict[str, Served]] = {}
        self._states: dict[str, dict[str, VersionState]] = {}
        self._loaded_scans: dict[str, tuple[ModelConfig | None, Scan]] = {}
        # Why a model that serves no version could not be read at all (its config), by name.
        self._refusals: dict[str, str] = {}
        self._lock = asyncio.Lock()
        self._retiring: set[asyncio.Task[None]] = set()
        self._finishing: set[Served] = set()  # retired, still answering their requests
        self._poller: asyncio.Task[None] | None = None
        self._retire_listeners: list[Callable[[Model], object]] = []
        self._idle_listeners: list[Callable[[], object]] = []
        self._change_listeners: list[Callable[[], object]] = []
        # The models the service must serve to be ready (``require``): those configured at
        # start, less each unloaded since (by the API, or by the poller as it left the root).
        self._required: set[str] = set()
        # The root as messages may spell it, longest first: refusals name files from it.
        spellings = {str(self.root), str(self.root.resolve())}
        self._roots = sorted(spellings, key=len, reverse=True)
        key = settings.model_verify_key  # every version's signature checked before it loads
        self.verifier = Verifier(key) if key is not None else None
        metrics.watch_queues(self.queues)  # the autoscaling gauges, read when scraped
        # Without config.pbtxt (unless strict), a model's config is derived from its ONNX file.
        self._complete = (
            None
            if settings.strict_model_config
            else config_completer(runtime, settings.default_max_batch_size, self.verifier)
        )

    # ---- lookups -----------------------------------------------------------------------------

    def names(self) -> list[str]:
        """Every model with at least one version serving."""
        return list(self._serving)

    def knows(self, name: str) -> bool:
        """Whether ``name`` serves, or has been loaded or tried since start."""
        return name in self._serving or name in self._states

    def get(self, name: str, version: str | None = None) -> Served:
        """A serving version (default: the highest), or ``NotFoundError``. The error names
        what was asked and nothing else: a client that may only probe health learns no other
        model's name from it (issue 62, item 9); ``GET /v2/models`` lists them to those
        allowed. An unknown version lists the versions of the model asked for."""
        versions = self._serving.get(name)
        if versions is None:
            raise NotFoundError(f"unknown model {name!r}")
        if version is None:
            return versions[max(versions, key=int)]
        served = versions.get(version)
        if served is None:
            raise NotFoundError(
                f"unknown version {version!r} of model {name!r}; available: {', '.join(versions)}"
            )
        return served

    def require(self, names: list[str]) -> None:
        """The models the service must serve to be ready: the control mode's at start."""
        self._required = set(names)

    def missing(self) -> list[str]:
        """The models the service must serve and does not (none: it can serve what it must)."""
        return sorted(name for name in self._required if name not in self._serving)

    def tried(self, name: str, version: str) -> bool:
        """Whether ``version`` of ``name`` has served, or failed to load, since start."""
        return version in self._states.get(name, {})

    def on_change(self, listener: Callable[[], object]) -> None:
        """Call ``listener`` whenever the models serving may have changed (a load's new set,
        an unload)."""
        self._change_listeners.append(listener)

    def _changed(self) -> None:
        for listener in self._change_listeners:
            listener()

    def all(self) -> list[Served]:
        """Every serving version."""
        return [s for versions in self._serving.values() for s in versions.values()]

    def in_flight(self, name: str) -> int:
        """The requests running or queued on ``name``'s serving versions."""
        return sum(s.in_flight for s in self._serving.get(name, {}).values())

    def queues(self) -> list[QueueSample]:
        """Each version held, serving or finishing its requests after it was retired: its
        requests waiting to run (``Scheduler.waiting``) and taken but not answered
        (``Served.in_flight``). Across workers it is read on the metrics' flushing thread:
        it only copies containers (one step each under the GIL) and reads counts."""
        held = [s for versions in list(self._serving.values()) for s in list(versions.values())]
        held += list(self._finishing)
        return [(s.model.name, s.model.version, s.scheduler.waiting(), s.in_flight) for s in held]

    def on_idle(self, listener: Callable[[], object]) -> None:
        """Call ``listener`` whenever a serving version's last request in flight ends."""
        self._idle_listeners.append(listener)

    def _idle(self) -> None:
        for listener in self._idle_listeners:
            listener()

    def loaded(self) -> dict[str, tuple[int, int]]:
        """Each loaded model that holds sessions, the room on_demand counts: its last use
        (``time.perf_counter_ns``) and its sessions' bytes. An ensemble holds none (its steps
        run as requests of their own): it takes no room, so its request in flight, waiting
        for a step to load, never holds the room that load waits for."""
        return {
            name: (max(s.last_used for s in versions.values()),
                   sum(s.memory_bytes for s in versions.values()))
            for name, versions in self._serving.items()
            if not any(s.model.config.steps for s in versions.values())
        }  # fmt: skip

    def statistics(self, name: str | None, version: str | None) -> list[dict[str, object]]:
        """Triton's statistics of every serving version, of one model's, or of one version."""
        if name is None:
            chosen = self.all()
        elif version is None:
            self.get(name)  # 404 for an unknown model
            chosen = list(self._serving[name].values())
        else:
            chosen = [self.get(name, version)]
        return [s.runs.statistics.to_triton(s.model.name, s.model.version) for s in chosen]

    def max_batch(self, model: Model) -> int:
        """The largest batch one request may carry for ``model``."""
        return self.settings.max_request_batch or model.config.max_batch_size

    async def index(self, ready_only: bool = False) -> list[dict[str, str]]:
        """Triton's repository index: every model in the repository with each version's state
        and reason; a model never loaded is listed by name alone.

        The repository's directory is listed on a worker thread, and only its first
        ``INDEX_MAX`` entries (a log line says when there are more): what the event loop does
        here grows with the models loaded or tried and at most ``INDEX_MAX`` names, however
        many entries the directory holds (issue 62, item 11, as ``check_name``)."""
        listed = await anyio.to_thread.run_sync(self._listed)
        names = set(listed) | set(self._serving) | set(self._states)
        entries: list[dict[str, str]] = []
        for name in sorted(names):
            states = self._states.get(name)
            if not states:
                refusal = self._refusals.get(name)
                if ready_only:
                    continue
                if refusal is None:
                    entries.append({"name": name})
                else:  # it could not be read at all: Triton's entry without a version
                    entries.append({"name": name, "state": UNAVAILABLE, "reason": refusal})
                continue
            for version, state in sorted(states.items(), key=lambda item: int(item[0])):
                if ready_only and state.state != READY:
                    continue
                entry = {"name": name, "version": version, "state": state.state}
                entries.append({**entry, "reason": state.reason})
        return entries

    # ---- changes -----------------------------------------------------------------------------

    async def load(self, name: str, log_failures: bool = True) -> None:
        """Load (or reload) ``name`` as its files and ``config.pbtxt`` say; the versions that
        load serve, the rest keep what was serving. ``ModelLoadError`` names each failure,
        whatever went wrong (logged too, unless the caller reports it itself); it is the only
        exception a load raises, besides ``NotFoundError`` for a name that is no model."""
        await self.check_name(name)
        async with self._lock:
            await self._load(name, self.root / name, log_failures)

    async def unload(self, name: str, reason: str = "unloaded", if_idle: bool = False) -> bool:
        """Stop serving every version of ``name``; each finishes its requests first. The
        index gives ``reason`` for each. With ``if_idle``, only when no request is running or
        queued on it (checked once the repository is this call's: on_demand's room is never
        made from a model in use). Whether any version was unloaded."""
        if name not in self._serving and name not in self._states:
            await self.check_name(name)
        async with self._lock:
            if if_idle and self.in_flight(name):
                return False
            return self._unload(name, reason)

    async def check_name(self, name: str) -> None:
        """``NotFoundError`` unless ``name`` is a model of the repository as the index lists
        them: a directory right under the root, by that very name. Not the root itself (""), a
        version directory, a hidden one, or another spelling of a path ("digits-mlp/./1"),
        each of which would otherwise become an entry of its own in the index.

        The name is checked as a string first, then with one ``stat`` on a worker thread: an
        unknown name costs the event loop no directory listing, whatever the repository holds
        (issue 62, item 11). The error names the name asked for, never the repository's path
        (item 9)."""
        plain = (
            0 < len(name.encode("utf-8", "surrogatepass")) <= NAME_MAX
            and not name.startswith(".")
            and "/" not in name
            and os.sep not in name
            and "\0" not in name
        )
        if not (plain and await anyio.to_thread.run_sync(self._is_model_dir, name)):
            raise NotFoundError(f"no model {name!r} in the repository")

    def _listed(self) -> list[str]:
        """The models among the root's first ``INDEX_MAX`` entries; none if it is unreadable."""
        try:
            names = model_names(self.root, INDEX_MAX + 1)
        except OSError:  # gone, or not a directory: the index lists what it knows
            return []
        if len(names) > INDEX_MAX:
            logger.warning(
                "the repository index lists %d of the models in %s: it holds more entries",
                INDEX_MAX,
                self.root,
            )
        return names[:INDEX_MAX]

    def _is_model_dir(self, name: str) -> bool:
        try:
            return (self.root / name).is_dir()
        except (OSError, ValueError):
            return False

    async def fingerprint(self, name: str) -> tuple[tuple[str, int, int, int], ...]:
        """What changes when any file of ``name`` changes: the path, size, modification and
        status-change times (the last cannot be set back) of each file in its directory and
        in each directory right under it; read on a worker thread. on_demand remembers a
        failed load by it."""
        return await anyio.to_thread.run_sync(self._fingerprint, self.root / name)

    @staticmethod
    def _fingerprint(model_dir: Path) -> tuple[tuple[str, int, int, int], ...]:
        entries: list[tuple[str, int, int, int]] = []

        def stamp(name: str, entry: os.DirEntry[str]) -> None:
            stat = entry.stat()
            entries.append((name, stat.st_size, stat.st_mtime_ns, stat.st_ctime_ns))

        try:
            with os.scandir(model_dir) as top:
                for entry in top:
                    stamp(entry.name, entry)
                    if entry.is_dir():
                        with os.scandir(entry.path) as inner:
                            for item in inner:
                                stamp(f"{entry.name}/{item.name}", item)
        except OSError:
            entries.append(("", -1, -1, -1))  # unreadable: a state of its own
        return tuple(sorted(entries))

    async def stop(self) -> None:
        """Stop polling, retire every version, and wait until all have drained."""
        if self._poller is not None:
            self._poller.cancel()
            await asyncio.gather(self._poller, return_exceptions=True)
            self._poller = None
        for name in list(self._serving):
            self._unload(name)
        await asyncio.gather(*self._retiring, return_exceptions=True)
        self.metrics.watch_queues(None)
        self._states.clear()
        self._loaded_scans.clear()
        self._refusals.clear()

    def start_polling(self, seconds: float) -> None:
        """Re-scan the repository every ``seconds`` (poll mode)."""
        self._poller = asyncio.get_running_loop().create_task(self.poll_forever(seconds))

    async def poll_forever(self, seconds: float) -> None:
        """Act on each model whose files changed, once two scans in a row agree. Each model
        is scanned and loaded on its own: one that cannot be read, or fails to load, is
        reported (a log line, the index) and the others go on; nothing stops the poller but
        ``stop()`` (issue 62, item 3)."""
        previous: dict[str, tuple[ModelConfig | None, Scan]] = {}
        while True:
            await asyncio.sleep(seconds)
            try:
                current = await anyio.to_thread.run_sync(self._scan_all)
            except Exception as exc:  # the root itself: unreadable, gone; the next scan may do
                logger.error("cannot scan the model repository %s: %s", self.root, first_line(exc))
                continue
            for name in sorted(set(current) | set(self._loaded_scans)):
                seen, before = current.get(name), previous.get(name)
                if seen != before or seen == self._loaded_scans.get(name):
                    continue  # still changing, or nothing new
                async with self._lock:
                    if seen is None:
                        logger.info("%s left the repository: unloading", name)
                        self._unload(name)
                        self._states.pop(name, None)
                        self._loaded_scans.pop(name, None)
                        self._refusals.pop(name, None)
                        continue
                    # A refusal is reported by _load; what was serving still serves.
                    with contextlib.suppress(ModelLoadError):
                        await self._load(name, self.root / name)
            previous = current

    # ---- inside the lock ---------------------------------------------------------------------

    async def _load(self, name: str, model_dir: Path, log_failures: bool = True) -> None:
        """``_load_versions``, with whatever escapes it (a bug's exception included) made the
        model's refusal: ``ModelLoadError`` is the only exception a load raises."""
        try:
            await self._load_versions(name, model_dir, log_failures)
        except ModelLoadError:
            raise
        except Exception as exc:
            reason = self._refusal(exc, name)
            current = self._serving.get(name, {})
            self._fail(name, {v: reason for v in current} or {"": reason}, log_failures)
            raise ModelLoadError(reason) from None

    async def _load_versions(self, name: str, model_dir: Path, log_failures: bool) -> None:
        current = self._serving.get(name, {})
        try:
            written, scan = await anyio.to_thread.run_sync(self._scan_model, model_dir)
            config = written
            if config is None:
                config = await anyio.to_thread.run_sync(self._derive, model_dir)
            selected = config.version_policy.select(list(scan))
        except Exception as exc:  # any type: the config's, the disk's, the runtime's
            reason = self._refusal(exc, f"{name}/{CONFIG_FILENAME}")
            self._loaded_scans[name] = await anyio.to_thread.run_sync(self._scan_quietly, model_dir)
            self._fail(name, {v: reason for v in current} or {"": reason}, log_failures)
            raise ModelLoadError(reason) from None
        self._loaded_scans[name] = (written, scan)  # as a poll's scan will see it
        self._refusals.pop(name, None)
        if config.unhonoured:
            logger.warning(
                "%s/config.pbtxt: %s read but not honoured", name, ", ".join(config.unhonoured)
            )
        kept: dict[str, Served] = {}
        failures: dict[str, str] = {}
        for version in selected:
            key = str(version)
            old = current.get(key)
            files = scan.get(version)
            if old is not None and old.signature == files and old.model.config == config:
                kept[key] = old  # unchanged: keeps serving, nothing reloaded
                continue
            try:
                kept[key] = await self._load_version(model_dir, version, config, files)
            except Exception as exc:  # any type: this version's refusal, the others go on
                failures[key] = self._refusal(exc, f"{name}/{version}")
                if old is not None:
                    kept[key] = old  # a broken new file leaves the old version serving
        self._swap(name, kept)
        if failures:
            self._fail(name, failures, log_failures)
            raise ModelLoadError("; ".join(failures.values()))

    async def _load_version(
        self, model_dir: Path, version: int, config: ModelConfig, files: tuple[int, ...] | None
    ) -> Served:
        """One version loaded, checked, warmed and made ready to serve; on any error what it
        had opened is closed again."""
        if files is None:
            raise ModelLoadError(f"{model_dir.name}/{version}: no readable model file")
        model = await anyio.to_thread.run_sync(
            load_version,
            model_dir,
            version,
            config,
            self.runtime,
            self.settings.warmup_runs,
            self.verifier,
        )
        try:
            served = await self._serve(model, files)
        except BaseException:
            model.close()
            raise
        served.on_idle = self._idle
        return served

    def _refusal(self, exc: BaseException, what: str) -> str:
        """The reason ``exc`` gives for refusing ``what`` (a model or a version), on one line,
        with the repository's location left out: its files are named from the root. A
        ``ModelLoadError`` already names what failed; any other exception is named with its
        type (a ``RecursionError`` says little by its message alone)."""
        text = first_line(exc)
        if not isinstance(exc, ModelLoadError):
            text = f"{what}: {type(exc).__name__}: {text}"
        for root in self._roots:
            text = text.replace(root + os.sep, "").replace(root, ".")
        return text

    def _unload(self, name: str, reason: str = "unloaded") -> bool:
        serving = self._serving.pop(name, {})
        for served in serving.values():
            self._retire(served)
        if serving or name not in self._states:  # a second unload keeps the first's reason
            states = self._states.get(name, {})
            self._states[name] = {v: VersionState(UNAVAILABLE, reason) for v in states}
        # Unloaded on purpose (on_demand never unloads a pinned model to make room): no longer
        # a model the service must serve to be ready, as Triton's strict readiness skips one.
        self._required.discard(name)
        self._changed()
        return bool(serving)

    def _swap(self, name: str, serving: dict[str, Served]) -> None:
        """The new set takes new requests at once; what it no longer holds is retired."""
        before = self._serving.get(name, {})
        if serving:
            self._serving[name] = dict(sorted(serving.items(), key=lambda kv: int(kv[0])))
        else:
            self._serving.pop(name, None)
        versions = list(self._serving.get(name, {}))
        for served in self._serving.get(name, {}).values():
            served.info = self._describe(served.model, versions)
        self._states[name] = {v: VersionState(READY) for v in versions}
        for version, served in before.items():
            if serving.get(version) is not served:
                self._retire(served)
                logger.info("%s/%s retired: finishing its requests", name, version)
        self._changed()

    def _fail(self, name: str, failures: dict[str, str], log: bool = True) -> None:
        """Each failure in the index (by version; "" for the model as a whole) and as one log
        line naming the repository (the refusal itself names files from its root)."""
        states = self._states.setdefault(name, {})
        for version, reason in failures.items():
            if version in self._serving.get(name, {}):  # the old files still serve
                states[version] = VersionState(READY, f"new files failed to load: {reason}")
            elif version:
                states[version] = VersionState(UNAVAILABLE, reason)
            else:
                self._refusals[name] = reason
            if log:
                logger.error("load failed: %s (model repository %s)", reason, self.root)
        self.metrics.load_failures.labels(name).inc(len(failures))

    def on_retire(self, listener: Callable[[Model], object]) -> None:
        """Call ``listener`` with each version's model as it is retired (unloaded, replaced)."""
        self._retire_listeners.append(listener)

    def _retire(self, served: Served) -> None:
        served.retired = True
        for listener in self._retire_listeners:
            listener(served.model)
        if not served.in_flight:
            served.drained.set()
        self._finishing.add(served)

        async def drain() -> None:
            await served.drained.wait()
            self._finishing.discard(served)
            await served.scheduler.stop()
            model = served.model
            providers = model.providers
            model.close()
            serving = self._serving.get(model.name, {})
            if model.version not in serving:  # a reload of the same version keeps its series
                self.metrics.forget(model.name, model.version, providers, not serving)

        task = asyncio.get_running_loop().create_task(drain())
        self._retiring.add(task)
        task.add_done_callback(self._retiring.discard)

    async def _serve(self, model: Model, files: tuple[int, ...]) -> Served:
        """A loaded version made ready to take requests: its inline limit and scheduler."""
        settings, config = self.settings, model.config
        for provider in model.providers:
            self.metrics.providers.labels(model.name, model.version, provider).set(1)
        if model.warmup_runs:
            self.metrics.warmup_runs.labels(model.name, model.version).inc(model.warmup_runs)
        runs = Runs(model, self.metrics)
        if config.steps:  # an ensemble: its steps are batched, each by its own scheduler
            return Served(model, Scheduler(model, runs, self.metrics), files, runs)
        batching = settings.batching and config.dynamic_batching and config.max_batch_size > 0
        size = (settings.batch_max_size or config.max_batch_size) if batching else 0
        inline_batch = await self._inline_limit(model, max(size, self.max_batch(model)))
        delay = settings.max_queue_delay_us
        if delay is None:
            delay = config.max_queue_delay_us or 0
        if config.scheduling is not None and not size:
            logger.warning(
                "%s/%s: dynamic_batching's priority levels and queue policies are not honoured "
                "without a batcher (GELU_BATCHING=false, or max_batch_size 0)",
                model.name,
                model.version,
            )
        scheduler = Scheduler(
            model, runs, self.metrics, inline_batch, size, delay, config.instance_count,
            config.scheduling,
        )  # fmt: skip
        scheduler.start()
        return Served(model, scheduler, files, runs)

    async def _inline_limit(self, model: Model, largest: int) -> int:
        """The largest batch of ``model`` that runs on the event loop: one whose run, timed
        here, takes at most ``GELU_INLINE_MAX_US``. Handing a run of a few microseconds to a
        thread costs more than the run; the loop blocks for at most the bound per run, and
        larger batches, or dearer models, go to a thread."""
        bound = self.settings.inline_max_us
        if not bound or not self.settings.warmup_runs:
            return 0
        limit, cost = await anyio.to_thread.run_sync(
            model.largest_batch_within, bound, max(largest, 1)
        )
        logger.info(
            "%s/%s: batches up to %d run on the event loop (%s %.0f µs, bound %d µs)",
            model.name,
            model.version,
            limit,
            f"a batch of {limit} took" if limit else "one sample took",
            cost,
            bound,
        )
        return limit

    def _describe(self, model: Model, versions: list[str]) -> ModelInfo:
        meta, config = model.metadata, model.config
        return ModelInfo(
            name=model.name,
            version=model.version,
            versions=versions,
            platform=config.platform,
            task=meta.task,
            arch=meta.arch,
            activation=meta.activation,
            label_names=meta.label_names,
            inputs=[TensorInfo(t.name, t.datatype, t.dims) for t in config.inputs],
            outputs=[TensorInfo(t.name, t.datatype, t.dims) for t in config.outputs],
            input_normalisation=meta.input_normalisation,
            metrics=meta.metrics,
            max_batch_size=self.max_batch(model),
            providers=model.providers,
            provider_options=model.session.provider_options,
            instance_count=config.instance_count,
            memory_bytes=model.session.memory_bytes,
            dynamic_batching=config.dynamic_batching,
            max_queue_delay_us=config.max_queue_delay_us,
            config_max_batch_size=config.max_batch_size,
            cuda_graphs=config.cuda_graphs,
            scheduling=config.scheduling,
            batch_invariant=config.batch_invariant,
            ensemble_steps=[
                {
                    "model_name": step.model_name,
                    "model_version": step.model_version,
                    "input_map": dict(step.input_map),
                    "output_map": dict(step.output_map),
                }
                for step in config.steps
            ],
        )

    # ---- scanning (off the loop) -------------------------------------------------------------

    def _scan_model(self, model_dir: Path) -> tuple[ModelConfig | None, Scan]:
        """The model's written config (None when it has none and one may be derived) and
        its versions' files; whatever the config's or the disk's error, it is raised."""
        if self._complete is not None and not (model_dir / CONFIG_FILENAME).exists():
            return None, self._scan_files(model_dir)
        return read_config(model_dir), self._scan_files(model_dir)

    def _scan_quietly(self, model_dir: Path) -> tuple[ModelConfig | None, Scan]:
        """What a poll's scan sees of a model whose config cannot be read: its versions'
        files (none, when even they cannot be listed). Never raises."""
        try:
            return None, self._scan_files(model_dir)
        except Exception:
            return None, {}

    def _derive(self, model_dir: Path) -> ModelConfig:
        assert self._complete is not None
        return read_config(model_dir, self._complete)

    @staticmethod
    def _scan_files(model_dir: Path) -> Scan:
        scan: Scan = {}
        for version in version_dirs(model_dir):
            try:
                scan[version] = signature(model_dir, version)
            except OSError:
                scan[version] = None
        return scan

    def _scan_all(self) -> dict[str, tuple[ModelConfig | None, Scan]]:
        """Every model's scan, each on its own: one whose config or files cannot be read is
        seen as ``_load`` records a failed one, so the poll retries it only once it changes."""
        scans: dict[str, tuple[ModelConfig | None, Scan]] = {}
        for name in model_names(self.root):
            model_dir = self.root / name
            try:
                scans[name] = self._scan_model(model_dir)
            except Exception:  # any type: reported when the poll loads it
                scans[name] = self._scan_quietly(model_dir)
        return scans
