"""The serving core: built, started and stopped with no web framework.

``DataPlane(settings)`` owns the live model repository (``service.repository``: sessions,
batchers, statistics), the activation evaluator and the metrics. ``await start()`` loads what
the model control mode names and builds the activation graphs; ``await stop()`` lets every
version finish its requests. Every face (the FastAPI app, the gRPC server, a Ray Serve replica, the
tests) translates its protocol to the calls here: ``infer``, ``activations``, ``model_metadata``,
``model_config``, ``statistics``. Model control (load, unload, the index) is not the core's:
it is its own handler over the same repository (``service.control``), which whoever composes
the service builds and hands to each face.
Requests are checked against the model here, once, so every face gives the same answer to the
same mistake.
"""

from __future__ import annotations

import gc
import logging
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any, TypeVar

import anyio.to_thread
import numpy as np

from contract.model_config import DELAY, QueuePolicy, SchedulingPolicy
from service import __version__, ensemble
from service.activations import Activations
from service.auth import Restrictions
from service.batching import CLIENT_TIMEOUT, POLICY_TIMEOUT, Deadline
from service.cache import Key, ResponseCache
from service.errors import (
    ModelLoadError,
    NotFoundError,
    NotReadyError,
    OverloadedError,
    StartupError,
)
from service.inference import (
    InferenceRequest,
    InferenceResult,
    ModelInfo,
)
from service.logs import LOGS
from service.metrics import Metrics
from service.onnxrt import OnnxRuntime, SessionFactory, session_options
from service.repository import ModelRepository
from service.repository.demand import OnDemand, Residency
from service.repository.layout import model_names
from service.repository.manager import Served
from service.runtime import Model, Runtime
from service.settings import Settings
from service.statistics import ModelStatistics
from service.trace_settings import TraceSettings
from service.tracing import Tracing

logger = logging.getLogger("gelu_serve")
T = TypeVar("T")
# Bodies up to this size are decoded and encoded on the event loop; see DataPlane.codec.
INLINE_CODEC_BYTES = 64 * 1024
SERVER_NAME = "gelu-serve"
# The protocol extensions served, on HTTP and gRPC alike (Triton's names).
EXTENSIONS = [
    "binary_tensor_data",
    "classification",
    "logging",
    "model_configuration",
    "model_repository",
    "schedule_policy",
    "statistics",
    "trace",
]


def top_classes(
    scores: np.ndarray, count: int, labels: tuple[str, ...], batched: bool
) -> np.ndarray:
    """Triton's classification extension: the ``count`` highest scores of each batch element
    (of the whole tensor when the model has no batch axis) as BYTES ``"score:index:label"``
    (``"score:index"`` where the class has no label), highest first; ``score`` is printed as
    Triton prints it, with six decimals."""
    rows = scores.reshape(len(scores), -1) if batched else scores.reshape(1, -1)
    count = min(count, rows.shape[1])
    order = np.argsort(-rows, axis=1, kind="stable")[:, :count]
    named = len(labels)
    classes = np.array(
        [
            [
                f"{row[i]:f}:{i}:{labels[i]}" if i < named else f"{row[i]:f}:{i}"
                for i in indices.tolist()
            ]
            for row, indices in zip(rows, order, strict=True)
        ],
        dtype=object,
    )
    return classes if batched else classes.reshape(-1)


class DataPlane:
    """Models, activations and inference, independent of any wire protocol."""

    def __init__(
        self, settings: Settings, metrics: Metrics | None = None, runtime: Runtime | None = None
    ) -> None:
        self.settings = settings
        self.runtime = runtime  # what opens model files; onnxruntime on the settings' providers
        self.metrics = metrics or Metrics(settings.prometheus_multiproc_dir is not None)
        self.repository: ModelRepository | None = None
        self.activations = Activations(
            settings.max_activation_elements,
            settings.inline_max_us,
            settings.warmup_runs,
            settings.intra_op_threads,
        )
        self._draining = False
        self._readiness_listeners: list[Callable[[bool], object]] = []
        self._was_ready = False  # what the listeners were last told
        self._codec_threads: anyio.CapacityLimiter | None = None
        self.on_demand: OnDemand | None = None  # GELU_MODEL_CONTROL_MODE=on_demand's loads
        self.logs = LOGS  # the logging extension: the process's, configured as the app starts
        # Credentials by route class (GELU_RESTRICTED_API, GELU_CONTROL_TOKEN); None: all open.
        self.restrictions = Restrictions.from_settings(settings)
        self.tracing: Tracing | None = None  # OpenTelemetry, when OTEL_TRACES_EXPORTER asks
        budget = settings.response_cache_bytes  # Triton's response cache, for models that ask
        self.cache = cache = ResponseCache(budget) if budget else None
        if cache is not None and not self.metrics.multiprocess:
            # Read at scrape time: a Gauge's set takes a lock, and a miss would pay it.
            self.metrics.cache_bytes.set_function(lambda: cache.used)
        self.trace_settings = TraceSettings(enabled=False)  # Triton's trace extension

    # ---- lifecycle ---------------------------------------------------------------------------

    async def start(self) -> None:
        """Load, check and warm the models the control mode names (off the event loop), build
        the activation graphs, start polling in poll mode; ``StartupError`` says what is wrong
        (a model that fails to load is one only with ``GELU_EXIT_ON_ERROR``)."""
        settings = self.settings
        root = settings.model_repository
        self.tracing = Tracing.from_environment(self.metrics.traces_dropped.inc)
        self.trace_settings = TraceSettings(enabled=self.tracing is not None)
        if not root.is_dir():
            raise StartupError(
                f"model repository {root} does not exist; build the defaults with `make models` "
                "or point GELU_MODEL_REPOSITORY at one"
            )
        options = session_options(
            settings.intra_op_threads, settings.inter_op_threads, settings.op_thread_spinning
        )
        sessions = SessionFactory(
            settings.ort_providers, options, settings.strict_providers, settings.provider_options
        )
        runtime = self.runtime or OnnxRuntime(sessions, settings.cuda_io_binding)
        repository = ModelRepository(settings, runtime, self.metrics)
        if self.cache is not None:
            repository.on_retire(self.cache.drop)  # a retired version's answers go with it
        names = model_names(root)
        if settings.model_control_mode == "explicit" and "*" not in settings.load_models:
            names = settings.load_models
        elif settings.model_control_mode == "on_demand":
            names = settings.pinned_models  # the rest at their first request
        repository.require(names)  # ready once each serves (docs/serving.md, "Readiness")
        repository.on_change(self._readiness_may_change)
        for name in names:
            try:
                # Refusing to start, the refusal is the one line that says why.
                await repository.load(name, log_failures=not settings.exit_on_error)
            except (ModelLoadError, NotFoundError) as exc:
                if settings.exit_on_error:
                    await repository.stop()
                    raise StartupError(f"{exc} (GELU_EXIT_ON_ERROR=true)") from None
        try:
            await self.activations.start(sessions, settings.compile_activations)
        except ModelLoadError as exc:
            await repository.stop()
            raise StartupError(str(exc)) from None
        if not repository.names():
            logger.warning("model repository %s: no model is serving", root)
        if settings.model_control_mode == "poll":
            repository.start_polling(settings.repository_poll_seconds)
        if settings.model_control_mode == "on_demand":
            self.on_demand = OnDemand(repository, settings, self.metrics)
            self.on_demand.record()
        self.repository = repository
        self._codec_threads = anyio.CapacityLimiter(1)
        # What start-up allocated lives as long as the process: keep the collector off it, so
        # collections under load scan only the requests' own objects (shorter GC pauses).
        gc.collect()
        gc.freeze()
        self._readiness_may_change()
        if repository.missing():
            self._log_missing()

    @asynccontextmanager
    async def running(self) -> AsyncIterator[DataPlane]:
        """Started for the block, stopped after it. A refusal to start, the core's or that of
        a face the block starts (a gRPC port in use), is logged as the one line that names
        what is at fault (the traceback only at debug level)."""
        try:
            await self.start()
            yield self
        except StartupError as exc:
            logger.error("cannot start: %s", exc, exc_info=logger.isEnabledFor(logging.DEBUG))
            raise
        finally:
            await self.stop()

    async def stop(self) -> None:
        """Stop polling; every version finishes its requests, then is released."""
        self.activations.stop()
        self.on_demand = None
        repository, self.repository = self.repository, None
        self._readiness_may_change()
        if repository is not None:
            await repository.stop()
        tracing, self.tracing = self.tracing, None
        if tracing is not None:
            await anyio.to_thread.run_sync(tracing.shutdown)  # the last spans leave

    def drain(self) -> None:
        """Report not ready from now on (the service is stopping), while still serving."""
        self._draining = True
        self._readiness_may_change()

    def on_readiness(self, listener: Callable[[bool], object]) -> None:
        """Call ``listener`` with the readiness each time it changes (a face's own readiness,
        gRPC health's), on the event loop."""
        self._readiness_listeners.append(listener)

    @property
    def ready(self) -> bool:
        """Whether the service should be sent traffic: started, not draining, and every model
        the control mode names at start (on_demand: the pinned ones) serving, less any
        unloaded on purpose since. Loads, unloads and evictions of other models never change
        it, and a model loading again keeps its old versions serving until the new set takes
        over (Triton flips not ready while any model loads: server#7014). With
        ``strict_readiness`` off, started and not draining is enough (Triton's
        --strict-readiness=false)."""
        repository = self.repository
        return (
            self.activations.started
            and not self._draining
            and repository is not None
            and (not self.settings.strict_readiness or not repository.missing())
        )

    def _readiness_may_change(self) -> None:
        ready = self.ready
        if ready == self._was_ready:
            return
        self._was_ready = ready
        if ready:
            assert self.repository is not None
            logger.info(
                "ready: %d model version(s) from %s, model control mode %s",
                len(self.repository.all()),
                self.settings.model_repository,
                self.settings.model_control_mode,
            )
        elif self.repository is not None and not self._draining:
            self._log_missing()
        for listener in self._readiness_listeners:
            listener(ready)

    def _log_missing(self) -> None:
        assert self.repository is not None
        missing = ", ".join(self.repository.missing())
        logger.warning("not ready: %s must serve (GELU_MODEL_CONTROL_MODE's models) and "
                       "does not", missing)  # fmt: skip

    async def check_model_ready(self, name: str, version: str | None = None) -> None:
        """Return when ``name`` (its latest version, or ``version``) is ready to serve;
        ``NotReadyError`` (503) when the repository holds the model but it is not ready (not
        loaded yet, unloaded, evicted, failed to load, or the service draining);
        ``NotFoundError`` (404) when the repository holds no such model (or the model serves
        and never had that version). The reason names nothing but what was asked (issue 62,
        item 9: a client that may only probe health learns no other model's name)."""
        repository = self.started_repository()
        what = f"model {name!r}" if version is None else f"version {version!r} of model {name!r}"
        try:
            repository.get(name, version)
        except NotFoundError:
            if name in repository.names():
                if version is None or not repository.tried(name, version):
                    raise  # the model serves, and never had that version
            else:
                await repository.check_name(name)  # 404 for a model the repository lacks
            raise NotReadyError(f"{what} is not ready: it is not loaded") from None
        if self._draining:
            raise NotReadyError(f"{what} is not ready: the service is stopping")

    # ---- models --------------------------------------------------------------------------------

    def started_repository(self) -> ModelRepository:
        """The live repository; 503 (``NotReadyError``) before ``start()`` and after ``stop()``."""
        if self.repository is None or not self.activations.started:
            raise NotReadyError("the service is not ready: its models are not loaded")
        return self.repository

    def model_names(self) -> list[str]:
        """Every model with a version serving."""
        return self.started_repository().names()

    def knows_model(self, name: str) -> bool:
        """Whether ``name`` is a model the repository serves or has tried to."""
        return self.repository is not None and self.repository.knows(name)

    def model(self, name: str, version: str | None = None) -> Model:
        """A serving model version (default: the latest), or 404; 503 before start."""
        return self.started_repository().get(name, version).model

    def model_info(self, name: str, version: str | None = None) -> ModelInfo:
        """Plain data about a model version, for the faces to describe it."""
        info = self.started_repository().get(name, version).info
        assert info is not None  # set when the version started serving
        return info

    def model_metadata(self, name: str, version: str | None = None) -> dict[str, Any]:
        """The model's metadata (one version's when ``version`` is named), for every face."""
        return self.model_info(name, version).metadata(one_version=version is not None)

    def model_config(self, name: str, version: str | None = None) -> dict[str, Any]:
        """The model's config.pbtxt as Triton's model configuration JSON."""
        return self.model_info(name, version).configuration()

    def server_metadata(self) -> dict[str, Any]:
        """The server's name, version and protocol extensions."""
        return {"name": SERVER_NAME, "version": __version__, "extensions": EXTENSIONS}

    # ---- statistics (Triton's extension) -----------------------------------------------------

    def statistics(
        self, name: str | None = None, version: str | None = None
    ) -> list[dict[str, object]]:
        """Triton's statistics: every serving version, one model's, or one version's; in
        on_demand mode each with its model's ``residency`` (loads, unloads, waits)."""
        stats = self.started_repository().statistics(name, version)
        if self.on_demand is not None:
            residency = self.on_demand.residency
            for entry in stats:
                entry["residency"] = residency.get(str(entry["name"]), Residency()).to_json()
        return stats

    # ---- inference -----------------------------------------------------------------------------

    async def infer(
        self, name: str, version: str | None, request: InferenceRequest
    ) -> InferenceResult:
        """Check ``request`` against the model, run it (batched when the model batches) and
        return the outputs asked for."""
        repository = self.started_repository()
        try:
            served = repository.get(name, version)
        except NotFoundError:
            if self.on_demand is None:
                raise
            began = time.perf_counter_ns()  # the wait for its load counts against its timeout
            served = await self.on_demand.get(name, version, self._deadline(request, began))
        limit = self.settings.max_queue_size
        if served.in_flight >= limit:
            raise OverloadedError(
                f"model {name!r} has {served.in_flight} requests queued or running, its maximum "
                "(GELU_MAX_QUEUE_SIZE); try again shortly"
            )
        statistics, began, ok = served.runs.statistics, time.perf_counter_ns(), False
        level, deadline = self._schedule(request, began, served.model.config.scheduling)
        served.in_flight += 1  # a version retired meanwhile finishes this request first
        served.last_used = began  # on_demand unloads the least recently used
        try:
            model = served.model
            max_batch = repository.max_batch(model)
            inputs = model.checked_inputs(request.inputs, max_batch)
            outputs = model.checked_outputs(request)
            names = None if outputs is None else [o.name for o in outputs]
            batched = model.config.max_batch_size > 0
            batch = len(next(iter(inputs.values()))) if batched else 1
            cache, hit = self.cache if model.config.response_cache else None, None
            owners: tuple[Model, ...] = ()
            if cache is not None:  # a call only for a model that asks for the cache
                owners = self._answerers(served)
                if owners:
                    key, hit = self._cached(cache, owners, inputs, names, statistics)
                else:  # a step not serving yet: its answer is not keyed
                    cache = None
            if hit is not None:
                results = hit
            elif model.config.steps:  # an ensemble: each step is a request of its own
                results, ran = await ensemble.run(model.config, inputs, self.infer, request)
                # A step that moved meanwhile: this answer is not the keyed versions'.
                if cache is not None and (ran != owners[1:] or self._answerers(served) != owners):
                    cache = None
            else:  # the version's one run path: batched, alone, inline or on a thread
                results = await served.scheduler.run(
                    inputs, batch, names, deadline, request.trace, level, request.id
                )
            if cache is not None and hit is None and not served.retired:
                self._keep(cache, key, owners, results, statistics)
            ok = True
        finally:
            served.finished()
            statistics.record_request(ok, time.perf_counter_ns() - began)
        assert served.info is not None
        if outputs is None:  # every output, in the model's order, as the request says
            return InferenceResult(
                model=served.info,
                outputs=results,
                binary_default=request.binary_outputs,
                inputs=inputs,
                id=request.id,
                answerer=served.model,
            )
        labels = served.info.label_names
        return InferenceResult(
            model=served.info,
            outputs={
                o.name: top_classes(results[o.name], o.class_count, labels, batched)
                if o.class_count
                else results[o.name]
                for o in outputs
            },
            binary={o.name: o.binary for o in outputs},
            inputs=inputs,
            id=request.id,
            answerer=served.model,
        )

    def _schedule(
        self, request: InferenceRequest, began: int, scheduling: SchedulingPolicy | None
    ) -> tuple[int, Deadline | None]:
        """A request's priority level and deadline under its model's ``scheduling`` policy
        (config.pbtxt's; None: the server's, one queue)."""
        if scheduling is None:
            return 1, self._deadline(request, began)
        level = scheduling.level(request.priority)
        return level, self._deadline(request, began, scheduling.policy(level))

    def _deadline(
        self, request: InferenceRequest, began: int, policy: QueuePolicy | None = None
    ) -> Deadline | None:
        """When a request that arrived at ``began`` must have started running (None: never).
        Under the server's policy (``policy`` None), its 'timeout' parameter, else
        GELU_DEFAULT_TIMEOUT_US; under a queue policy of config.pbtxt, the policy's timeout
        (which the request's may shorten, where the policy allows it) and its timeout action.
        A client's own deadline (gRPC's) that comes sooner is the deadline: past it nobody
        waits for the answer, so the request is refused whatever the action."""
        if policy is None:
            timeout_us = request.timeout_us
            if timeout_us is None:
                timeout_us = self.settings.default_timeout_us
            deadline = Deadline(began, timeout_us) if timeout_us else None
        else:
            timeout_us = policy.timeout_us(request.timeout_us)
            delay = policy.timeout_action == DELAY
            deadline = Deadline(began, timeout_us, delay, POLICY_TIMEOUT) if timeout_us else None
        client = request.client_deadline_ns
        if client is not None and (deadline is None or client < deadline.at_ns):
            return Deadline(began, max(client - began, 0) // 1000, False, CLIENT_TIMEOUT)
        return deadline

    def _answerers(self, served: Served) -> tuple[Model, ...]:
        """The loaded versions whose answer a request of ``served`` is: its own model's, and
        for an ensemble each step's, as the steps resolve now; none when a step has no version
        serving (on_demand: not loaded yet). A cached answer is keyed by all of them, so a step
        moving to a new version never serves a stale answer (issue 62, item 8)."""
        model = served.model
        if not model.config.steps:
            return (model,)
        repository = self.started_repository()
        owners = [model]
        for step in model.config.steps:
            version = str(step.model_version) if step.model_version > 0 else None
            try:
                owners.append(repository.get(step.model_name, version).model)
            except NotFoundError:
                return ()
        return tuple(owners)

    def _cached(
        self,
        cache: ResponseCache,
        owners: tuple[Model, ...],
        inputs: dict[str, np.ndarray],
        names: list[str] | None,
        statistics: ModelStatistics,
    ) -> tuple[Key, dict[str, np.ndarray] | None]:
        """A cached model's key for this request (its ``owners``, ``_answerers``), and its
        answer if the cache has it (a hit timed as Triton's ``cache_hit``; a miss's lookup is
        timed with its insertion)."""
        began = time.perf_counter_ns()
        key = cache.key(owners, inputs, names)
        hit = cache.get(key)
        took = time.perf_counter_ns() - began
        if hit is not None:
            statistics.cache_hit.add(took)
            self.metrics.cache_lookups.labels(owners[0].name, "hit").inc()
        else:
            miss = statistics.cache_miss  # its insertion's time is added by _keep
            miss.count += 1
            miss.ns += took
            self.metrics.cache_lookups.labels(owners[0].name, "miss").inc()
        return key, hit

    def _keep(
        self,
        cache: ResponseCache,
        key: Key,
        owners: tuple[Model, ...],
        results: dict[str, np.ndarray],
        statistics: ModelStatistics,
    ) -> None:
        began = time.perf_counter_ns()
        cache.put(key, results, owners)
        statistics.cache_miss.ns += time.perf_counter_ns() - began  # a miss: lookup + insertion
        if self.metrics.multiprocess:  # each worker's own bytes, summed (livesum)
            self.metrics.cache_bytes.set(cache.used)

    # ---- wire formats --------------------------------------------------------------------------

    async def codec(self, size: int, function: Callable[..., T], *args: Any) -> T:
        """``function(*args)``: a face's decode or encode of a body of ``size`` bytes.

        Up to ``INLINE_CODEC_BYTES`` it runs at once, on the event loop (a 64 KiB JSON parses
        in about 0.3 ms). A larger body runs on a worker thread, one at a time: parsing JSON
        costs about 15 times its size in memory, and orjson and numpy hold the GIL for one
        call at a time, so the loop still answers (liveness, small requests) between calls,
        and concurrent large bodies queue instead of multiplying their cost.
        """
        if size <= INLINE_CODEC_BYTES or self._codec_threads is None:
            return function(*args)
        return await anyio.to_thread.run_sync(function, *args, limiter=self._codec_threads)
