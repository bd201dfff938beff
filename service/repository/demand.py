"""On-demand loading (``GELU_MODEL_CONTROL_MODE=on_demand``): a model loads at its first
request, and the least recently used are unloaded to keep the loaded ones within a count
(``GELU_MAX_LOADED_MODELS``) and a size (``GELU_MODEL_MEMORY_BYTES``), as ModelMesh and Ray
Serve's ``@serve.multiplexed`` do. Pinned models (``GELU_PINNED_MODELS``) load at start and
are never unloaded to make room.

A fleet of models drops no request (issue 62, item 7):

- Concurrent first requests for one model share one load; a request waits for it within its
  deadline (its 'timeout', else ``GELU_DEFAULT_TIMEOUT_US``), then 503 with Retry-After.
- A model with requests running or queued (``Served.in_flight``), or waiting for its load, is
  never unloaded to make room. When every other loaded model is in use, a load waits for one
  to fall idle (the repository tells this as a version's last request ends), within its
  requests' deadlines; it fails at once only when every other loaded model is pinned. An
  ensemble holds no session and takes no room (``ModelRepository.loaded``): the only requests
  that wait for a load while in flight are an ensemble's, so no load waits on its own waiter.
- A model loads before anything is unloaded for it, so one that cannot load evicts nothing.
  Its refusal is remembered: until its files change, or a back-off has passed (doubling from
  ``RETRY_FIRST_S`` to ``RETRY_LAST_S`` while the files stay as they were), a request for it
  gets the same answer, 400 "failed to load", at the cost of reading its directory's entries.
- Loads are admitted one at a time (the repository loads one model at a time anyway): a load
  holds the admission until the budget holds again, so the count is above
  ``GELU_MAX_LOADED_MODELS`` by at most the one model that just loaded, and only until another
  model falls idle.

Unloading goes through the repository, so a version finishes its requests in flight (and those
queued) before its session is released: making room never fails a request.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass

from service.batching import Deadline
from service.errors import (
    LoadFailedError,
    ModelLoadError,
    NotFoundError,
    NotReadyError,
    OverloadedError,
)
from service.metrics import Metrics
from service.repository.manager import ModelRepository, Served
from service.settings import Settings

logger = logging.getLogger("gelu_serve")

# A request that finds its model unloaded again right after waiting for it (an unload through
# the repository API meanwhile) waits for a load again, this many times at most.
ATTEMPTS = 3
# A model that failed to load is tried again, with its files unchanged, after this many
# seconds; each failure in a row doubles it, up to the last.
RETRY_FIRST_S = 1.0
RETRY_LAST_S = 60.0


@dataclass
class Residency:
    """One model's loads, unloads to make room, and waits for a load, since start (its
    statistics' ``residency``): counts, and nanoseconds for loads and waits."""

    loads: int = 0
    load_ns: int = 0
    evictions: int = 0
    waits: int = 0
    wait_ns: int = 0

    def to_json(self) -> dict[str, object]:
        return {"loads": {"count": self.loads, "ns": self.load_ns}, "evictions": self.evictions,
                "waits": {"count": self.waits, "ns": self.wait_ns}}  # fmt: skip


@dataclass(frozen=True)
class Refusal:
    """A load that failed: its reason, the model's files as it read them, and when it may be
    tried again with those same files (``time.monotonic``)."""

    reason: str
    files: object
    retry_at: float
    backoff_s: float


class OnDemand:
    """Loads ``repository``'s models as requests ask for them, within the budget."""

    def __init__(self, repository: ModelRepository, settings: Settings, metrics: Metrics) -> None:
        self.repository = repository
        self.max_models = settings.max_loaded_models or None  # None: no bound
        self.max_bytes = settings.model_memory_bytes or None
        self.pinned = frozenset(settings.pinned_models)
        self.metrics = metrics
        # All by model name, bounded by the repository's models (any other name is 404 before
        # it reaches them).
        self.residency: dict[str, Residency] = {}
        self._loading: dict[str, asyncio.Future[None]] = {}  # settled once the model serves
        self._waiting: dict[str, int] = {}  # requests (and API loads) waiting for its load
        self._refused: dict[str, Refusal] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        self._admission = asyncio.Lock()
        self._change: asyncio.Future[None] | None = None  # settled when room may have appeared
        repository.on_idle(self._wake)

    # ---- requests ----------------------------------------------------------------------------

    async def get(self, name: str, version: str | None, deadline: Deadline | None) -> Served:
        """A serving version of ``name``, loading the model first if it is not loaded: 404
        for a model the repository does not hold, 400 for one that fails to load, 503 for one
        whose load (or the room for it) outlasts the request's deadline. The caller raises
        ``in_flight`` of the version returned before its next ``await``."""
        self._enter(name)
        try:
            for _ in range(ATTEMPTS):
                try:
                    return self.repository.get(name, version)
                except NotFoundError:
                    if name in self.repository.names():
                        raise  # loaded, without that version
                await self.wait(name, deadline)
        finally:
            self._leave(name)
        raise OverloadedError(
            f"model {name!r} was unloaded through the repository API as it loaded; try again"
        )

    async def wait(self, name: str, deadline: Deadline | None) -> None:
        """Until ``name`` is loaded (by this request, or by the one already loading it)."""
        loading = self._loading.get(name)
        if loading is None:
            await self.repository.check_name(name)  # 404 before anything is loaded or unloaded
            if name in self.repository.names():
                return  # loaded by another request meanwhile
            loading = self._loading.get(name) or self._start(name, remembered=True)
        began = time.perf_counter_ns()
        try:
            timeout = None if deadline is None else max(0.0, deadline.seconds_left())
            await asyncio.wait_for(asyncio.shield(loading), timeout)
        except TimeoutError:
            raise OverloadedError(
                f"model {name!r} is still loading: not loaded within the request's timeout "
                "(its 'timeout' parameter, else GELU_DEFAULT_TIMEOUT_US)"
            ) from None
        except ModelLoadError as exc:
            raise LoadFailedError(name, str(exc)) from None
        finally:
            waited = time.perf_counter_ns() - began
            self.metrics.load_waits.observe(waited / 1e9)
            residency = self.residency.setdefault(name, Residency())
            residency.waits += 1
            residency.wait_ns += waited

    async def load(self, name: str) -> None:
        """Load (or reload) ``name`` now, within the budget: the repository API's load. An
        operator's load tries again at once, whatever refusal was remembered."""
        await self.repository.check_name(name)
        self._enter(name)
        try:
            await asyncio.shield(self._loading.get(name) or self._start(name, remembered=False))
        finally:
            self._leave(name)

    def record(self) -> None:
        """The loaded models' count and bytes, to /metrics (after any load or unload)."""
        loaded = self.repository.loaded()
        self.metrics.loaded_models.set(len(loaded))
        self.metrics.loaded_model_bytes.set(held(loaded))
        self._wake()  # an unload through the repository API makes room

    # ---- one load ----------------------------------------------------------------------------

    def _start(self, name: str, remembered: bool) -> asyncio.Future[None]:
        loop = asyncio.get_running_loop()
        loading: asyncio.Future[None] = loop.create_future()
        # A refusal no request is left to read (they timed out) is no error of the loop's.
        loading.add_done_callback(lambda done: done.cancelled() or done.exception())
        self._loading[name] = loading
        task = loop.create_task(self._load(name, loading, remembered))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return loading

    async def _load(self, name: str, loading: asyncio.Future[None], remembered: bool) -> None:
        """The pipeline of one load: a remembered refusal, room, the load, then the budget
        restored; its requests are answered once the model serves (or cannot)."""
        try:
            if remembered:
                await self._check_refused(name)
            async with self._admission:
                if not self._waiting.get(name):
                    raise OverloadedError(f"no request waits for {name!r} any more")
                await self._room_for(name)
                await self._open(name)
                await self._fit(name, loading)
            self._settle(name, loading, None)
        except Exception as exc:  # every path answers the requests waiting
            self._settle(name, loading, exc)
        except BaseException:  # cancelled: the service is stopping
            self._settle(name, loading, NotReadyError(f"model {name!r}: the service is stopping"))
            raise
        finally:
            self.record()

    def _settle(self, name: str, loading: asyncio.Future[None], error: Exception | None) -> None:
        if self._loading.get(name) is loading:
            del self._loading[name]
        if loading.done():
            return
        if error is None:
            loading.set_result(None)
        else:
            loading.set_exception(error)

    async def _check_refused(self, name: str) -> None:
        """The remembered refusal again, while the model's files are as it read them and its
        back-off lasts: a model that cannot load costs no load, and unloads nothing."""
        refused = self._refused.get(name)
        if refused is None or time.monotonic() >= refused.retry_at:
            return
        if await self.repository.fingerprint(name) == refused.files:
            raise ModelLoadError(refused.reason)

    async def _open(self, name: str) -> None:
        """The repository's load of ``name``; a refusal is remembered with the files read."""
        files = await self.repository.fingerprint(name)
        began = time.perf_counter_ns()
        try:
            await self.repository.load(name)
        except ModelLoadError as exc:
            if name not in self.repository.names():  # no version serves: the model's refusal
                self._remember(name, files, str(exc))
                raise
        finally:
            self.record()
        self._refused.pop(name, None)
        took = time.perf_counter_ns() - began
        self.metrics.loads.observe(took / 1e9)
        residency = self.residency.setdefault(name, Residency())
        residency.loads += 1
        residency.load_ns += took

    def _remember(self, name: str, files: object, reason: str) -> None:
        before = self._refused.get(name)
        backoff = RETRY_FIRST_S
        if before is not None and before.files == files:
            backoff = min(before.backoff_s * 2, RETRY_LAST_S)
        self._refused[name] = Refusal(reason, files, time.monotonic() + backoff, backoff)

    # ---- room --------------------------------------------------------------------------------

    async def _room_for(self, name: str) -> None:
        """Until loading ``name`` leaves room to come back within GELU_MAX_LOADED_MODELS by
        unloading idle models: ``OverloadedError`` at once if every other loaded model is
        pinned, or once no request waits for ``name`` any more (they timed out)."""
        if self.max_models is None:
            return
        while True:
            others = [n for n in self.repository.loaded() if n != name]
            needed = len(others) + 1 - self.max_models  # unloads once it has loaded
            if needed <= 0:
                return
            candidates = [n for n in others if n not in self.pinned]
            if not candidates:
                raise OverloadedError(
                    f"no room to load {name!r} within GELU_MAX_LOADED_MODELS: every loaded "
                    "model is pinned"
                )
            if sum(self._idle(n) for n in candidates) >= needed:
                return
            if not self._waiting.get(name):
                raise OverloadedError(f"no request waits for {name!r} any more")
            await self._changed()

    async def _fit(self, name: str, loading: asyncio.Future[None]) -> None:
        """Unload the least recently used idle models until at most ``max_models`` are
        loaded, holding at most ``max_bytes`` (None: any); never a pinned model, the one just
        loaded, or one in use. While every candidate is in use, ``name``'s requests go on
        and this waits for one to fall idle."""
        repository = self.repository
        while True:
            loaded = repository.loaded()
            count_over = self.max_models is not None and len(loaded) > self.max_models
            bytes_over = self.max_bytes is not None and held(loaded) > self.max_bytes
            if not (count_over or bytes_over):
                return
            candidates = [n for n in loaded if n != name and n not in self.pinned]
            if not candidates:  # only by bytes: the count's room was made sure of before
                reason = "no room within GELU_MODEL_MEMORY_BYTES: every other model is pinned"
                await repository.unload(name, reason)
                raise OverloadedError(f"no room to load {name!r} within GELU_MODEL_MEMORY_BYTES: "
                                      "every other loaded model is pinned")  # fmt: skip
            idle = [(loaded[n][0], n) for n in candidates if self._idle(n)]
            if not idle:
                self._settle(name, loading, None)  # its requests go on meanwhile
                await self._changed()
                continue
            _, victim = min(idle)
            reason = f"unloaded to make room for {name!r} (least recently used)"
            if await repository.unload(victim, reason, if_idle=True):
                logger.info("%s %s", victim, reason)
                self.metrics.evictions.labels(victim).inc()
                self.residency.setdefault(victim, Residency()).evictions += 1

    def _idle(self, name: str) -> bool:
        """Whether ``name`` may be unloaded to make room: not pinned, no request running or
        queued on it, none waiting for it."""
        return (
            name not in self.pinned
            and not self._waiting.get(name)
            and not self.repository.in_flight(name)
        )

    def _enter(self, name: str) -> None:
        self._waiting[name] = self._waiting.get(name, 0) + 1

    def _leave(self, name: str) -> None:
        left = self._waiting[name] - 1
        if left:
            self._waiting[name] = left
        else:
            del self._waiting[name]
            self._wake()  # it may be idle now, or its load has no one left to wait for it

    async def _changed(self) -> None:
        """Until a model may have fallen idle, or a request stopped waiting."""
        if self._change is None or self._change.done():
            self._change = asyncio.get_running_loop().create_future()
        await self._change

    def _wake(self) -> None:
        change = self._change
        if change is not None and not change.done():
            change.set_result(None)


def held(loaded: dict[str, tuple[int, int]]) -> int:
    """The bytes the loaded models' sessions hold, from ``ModelRepository.loaded()``."""
    return sum(size for _used, size in loaded.values())
