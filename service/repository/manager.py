"""The live model repository: which model versions serve, and how they change while serving.

As Triton's model repository manager: ``load(name)`` reads the model's ``config.pbtxt``, picks
the versions its ``version_policy`` names, and loads, checks and warms each new or changed
version off the event loop, reusing those whose files have not changed. Only then does the new
set take new requests, in one assignment on the loop; a version it replaces (or that is gone)
is retired: it finishes its in-flight and queued requests, then its batcher and session are
released. A version that fails to load leaves what was serving untouched and is reported as
``UNAVAILABLE`` with the reason (``index()``, a log line, a metric). ``unload(name)`` retires
every version. ``poll_forever()`` re-scans the repository and acts on a model whose files have
changed only once two scans in a row agree, so a file still being copied is never loaded.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import anyio.to_thread

from contract.model_config import ModelConfig
from contract.names import CONFIG_FILENAME
from service.batching import Batcher, Runs
from service.errors import ModelLoadError, NotFoundError
from service.inference import ModelInfo, TensorInfo
from service.metrics import Metrics
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


@dataclass(eq=False)
class Served:
    """One model version taking requests: its model, batcher, and requests in flight."""

    model: Model
    batcher: Batcher | None
    inline_batch: int  # the largest batch run on the event loop (0: always on a thread)
    signature: tuple[int, ...]
    runs: Runs
    info: ModelInfo | None = None
    in_flight: int = 0
    retired: bool = False
    last_used: int = field(default_factory=time.perf_counter_ns)  # its last request's arrival
    drained: asyncio.Event = field(default_factory=asyncio.Event)

    @property
    def memory_bytes(self) -> int:
        """What its session holds: the resident memory it added as it opened, never less than
        its model file (``signature`` ends with its size and time), as a session opened in
        memory freed by another adds nothing to the process's."""
        return max(self.model.session.memory_bytes, self.signature[-2])

    def finished(self) -> None:
        """One request of this version is done (``in_flight`` was raised for it when it
        arrived); a retired version that has no more can be released."""
        self.in_flight -= 1
        if self.retired and not self.in_flight:
            self.drained.set()


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
        self._lock = asyncio.Lock()
        self._retiring: set[asyncio.Task[None]] = set()
        self._poller: asyncio.Task[None] | None = None
        self._retire_listeners: list[Callable[[Model], object]] = []
        key = settings.model_verify_key  # every version's signature checked before it loads
        self.verifier = Verifier(key) if key is not None else None
        # Without config.pbtxt (unless strict), a model's config is derived from its ONNX file.
        self._complete = (
            None
            if settings.strict_model_config
            else config_completer(runtime, settings.default_max_batch_size)
        )

    # ---- lookups -----------------------------------------------------------------------------

    def names(self) -> list[str]:
        """Every model with at least one version serving."""
        return list(self._serving)

    def knows(self, name: str) -> bool:
        """Whether ``name`` serves, or has been loaded or tried since start."""
        return name in self._serving or name in self._states

    def get(self, name: str, version: str | None = None) -> Served:
        """A serving version (default: the highest), or ``NotFoundError``."""
        versions = self._serving.get(name)
        if versions is None:
            raise NotFoundError(f"unknown model {name!r}; available: {', '.join(self._serving)}")
        if version is None:
            return versions[max(versions, key=int)]
        served = versions.get(version)
        if served is None:
            raise NotFoundError(
                f"unknown version {version!r} of model {name!r}; available: {', '.join(versions)}"
            )
        return served

    def all(self) -> list[Served]:
        """Every serving version."""
        return [s for versions in self._serving.values() for s in versions.values()]

    def loaded(self) -> dict[str, tuple[int, int]]:
        """Each loaded model's last use (``time.perf_counter_ns``) and its sessions' bytes."""
        return {
            name: (max(s.last_used for s in versions.values()),
                   sum(s.memory_bytes for s in versions.values()))
            for name, versions in self._serving.items()
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

    def index(self, ready_only: bool = False) -> list[dict[str, str]]:
        """Triton's repository index: every model in the repository with each version's state
        and reason; a model never loaded is listed by name alone."""
        names = set(self._serving) | set(self._states)
        if self.root.is_dir():
            names |= set(model_names(self.root))
        entries: list[dict[str, str]] = []
        for name in sorted(names):
            states = self._states.get(name)
            if not states:
                if not ready_only:
                    entries.append({"name": name})
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
        load serve, the rest keep what was serving. ``ModelLoadError`` names each failure
        (logged too, unless the caller reports it itself)."""
        self.check_name(name)
        async with self._lock:
            await self._load(name, self.root / name, log_failures)

    async def unload(self, name: str, reason: str = "unloaded") -> bool:
        """Stop serving every version of ``name``; each finishes its requests first. The
        index gives ``reason`` for each. Whether any version was serving."""
        if name not in self._serving and name not in self._states:
            self.check_name(name)
        async with self._lock:
            return self._unload(name, reason)

    def check_name(self, name: str) -> None:
        """``NotFoundError`` unless ``name`` is a model of the repository as the index lists
        them: a directory right under the root, by that very name. Not the root itself (""), a
        version directory, a hidden one, or another spelling of a path ("digits-mlp/./1"),
        each of which would otherwise become an entry of its own in the index."""
        if not (self.root.is_dir() and name in model_names(self.root)):
            raise NotFoundError(f"no model {name!r} in the repository {self.root}")

    async def stop(self) -> None:
        """Stop polling, retire every version, and wait until all have drained."""
        if self._poller is not None:
            self._poller.cancel()
            await asyncio.gather(self._poller, return_exceptions=True)
            self._poller = None
        for name in list(self._serving):
            self._unload(name)
        await asyncio.gather(*self._retiring, return_exceptions=True)
        self._states.clear()
        self._loaded_scans.clear()

    def start_polling(self, seconds: float) -> None:
        """Re-scan the repository every ``seconds`` (poll mode)."""
        self._poller = asyncio.get_running_loop().create_task(self.poll_forever(seconds))

    async def poll_forever(self, seconds: float) -> None:
        """Act on each model whose files changed, once two scans in a row agree."""
        previous: dict[str, tuple[ModelConfig | None, Scan]] = {}
        while True:
            await asyncio.sleep(seconds)
            try:
                current = await anyio.to_thread.run_sync(self._scan_all)
            except OSError as exc:
                logger.error("cannot scan %s: %s", self.root, exc)
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
                    else:
                        # A failure is reported by _load; what was serving still serves.
                        with contextlib.suppress(ModelLoadError, NotFoundError):
                            await self._load(name, self.root / name)
            previous = current

    # ---- inside the lock ---------------------------------------------------------------------

    async def _load(self, name: str, model_dir: Path, log_failures: bool = True) -> None:
        current = self._serving.get(name, {})
        try:
            written, scan = await anyio.to_thread.run_sync(self._scan_model, model_dir)
            config = written
            if config is None:
                config = await anyio.to_thread.run_sync(self._derive, model_dir)
        except ModelLoadError as exc:
            self._loaded_scans[name] = (None, self._scan_files(model_dir))
            self._fail(name, {v: str(exc) for v in current} or {"": str(exc)}, log_failures)
            raise
        self._loaded_scans[name] = (written, scan)  # as a poll's scan will see it
        if config.unhonoured:
            logger.warning(
                "%s/config.pbtxt: %s read but not honoured", name, ", ".join(config.unhonoured)
            )
        selected = config.version_policy.select(list(scan))
        kept: dict[str, Served] = {}
        failures: dict[str, str] = {}
        for version in selected:
            key = str(version)
            old = current.get(key)
            files = scan[version]
            if old is not None and old.signature == files and old.model.config == config:
                kept[key] = old  # unchanged: keeps serving, nothing reloaded
                continue
            try:
                if files is None:
                    raise ModelLoadError(f"{name}/{version}: no readable model file")
                model = await anyio.to_thread.run_sync(
                    load_version,
                    model_dir,
                    version,
                    config,
                    self.runtime,
                    self.settings.warmup_runs,
                    self.verifier,
                )
                kept[key] = await self._serve(model, files)
            except ModelLoadError as exc:
                failures[key] = str(exc)
                if old is not None:
                    kept[key] = old  # a broken new file leaves the old version serving
        self._swap(name, kept)
        if failures:
            self._fail(name, failures, log_failures)
            raise ModelLoadError("; ".join(failures.values()))

    def _unload(self, name: str, reason: str = "unloaded") -> bool:
        serving = self._serving.pop(name, {})
        for served in serving.values():
            self._retire(served)
        if serving or name not in self._states:  # a second unload keeps the first's reason
            states = self._states.get(name, {})
            self._states[name] = {v: VersionState(UNAVAILABLE, reason) for v in states}
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

    def _fail(self, name: str, failures: dict[str, str], log: bool = True) -> None:
        states = self._states.setdefault(name, {})
        for version, reason in failures.items():
            if version in self._serving.get(name, {}):  # the old files still serve
                states[version] = VersionState(READY, f"new files failed to load: {reason}")
            elif version:
                states[version] = VersionState(UNAVAILABLE, reason)
            if log:
                logger.error("load failed: %s", reason)
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

        async def drain() -> None:
            await served.drained.wait()
            if served.batcher is not None:
                await served.batcher.stop()
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
        """A loaded version made ready to take requests: its inline limit and batcher."""
        settings, config = self.settings, model.config
        for provider in model.providers:
            self.metrics.providers.labels(model.name, model.version, provider).set(1)
        if model.warmup_runs:
            self.metrics.warmup_runs.labels(model.name, model.version).inc(model.warmup_runs)
        if config.steps:  # an ensemble: its steps are batched, each by its own batcher
            return Served(model, None, 0, files, Runs(model, self.metrics))
        batching = settings.batching and config.dynamic_batching and config.max_batch_size > 0
        size = (settings.batch_max_size or config.max_batch_size) if batching else 0
        inline_batch = await self._inline_limit(model, max(size, self.max_batch(model)))
        batcher = None
        runs = Runs(model, self.metrics)
        if batching:
            delay = settings.max_queue_delay_us
            if delay is None:
                delay = config.max_queue_delay_us or 0
            # Inline batches stay within the bound; a larger request runs on a thread.
            size = min(size, inline_batch) if inline_batch else size
            batcher = Batcher(
                model,
                size,
                delay,
                self.metrics,
                runs,
                inline=inline_batch > 0,
                instances=config.instance_count,
            )
            batcher.start()
        return Served(model, batcher, inline_batch, files, runs)

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
        its versions' files."""
        if self._complete is not None and not (model_dir / CONFIG_FILENAME).exists():
            return None, self._scan_files(model_dir)
        return read_config(model_dir), self._scan_files(model_dir)

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
        scans: dict[str, tuple[ModelConfig | None, Scan]] = {}
        for name in model_names(self.root):
            model_dir = self.root / name
            try:
                scans[name] = self._scan_model(model_dir)
            except ModelLoadError:
                scans[name] = (None, self._scan_files(model_dir))
        return scans
