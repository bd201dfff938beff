"""On-demand loading (``GELU_MODEL_CONTROL_MODE=on_demand``): a model loads at its first
request, and the least recently used are unloaded to keep the loaded ones within a count
(``GELU_MAX_LOADED_MODELS``) and a size (``GELU_MODEL_MEMORY_BYTES``), as ModelMesh and Ray
Serve's ``@serve.multiplexed`` do. Pinned models (``GELU_PINNED_MODELS``) load at start and
are never unloaded to make room.

Concurrent first requests for one model share one load; a request waits for it within its
deadline. Unloading goes through the repository, so a version finishes its requests in flight
(and those queued) before its session is released: making room never fails a request.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass

from service.batching import Deadline
from service.errors import ModelLoadError, NotFoundError, NotReadyError, OverloadedError
from service.metrics import Metrics
from service.repository.manager import ModelRepository, Served
from service.settings import Settings

logger = logging.getLogger("gelu_serve")

# A request that finds its model unloaded again right after waiting for it (room was made
# for another meanwhile) loads it again, this many times at most.
ATTEMPTS = 3


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


class OnDemand:
    """Loads ``repository``'s models as requests ask for them, within the budget."""

    def __init__(self, repository: ModelRepository, settings: Settings, metrics: Metrics) -> None:
        self.repository = repository
        self.max_models = settings.max_loaded_models or None  # None: no bound
        self.max_bytes = settings.model_memory_bytes or None
        self.pinned = frozenset(settings.pinned_models)
        self.metrics = metrics
        self._loading: dict[str, asyncio.Task[None]] = {}
        # By model name: bounded by the repository's models (a request for any other is 404).
        self.residency: dict[str, Residency] = {}

    async def get(self, name: str, version: str | None, deadline: Deadline | None) -> Served:
        """A serving version of ``name``, loading the model first if it is not loaded: 404
        for a model the repository does not hold, 503 for one that fails to load or whose
        load outlasts the request's deadline."""
        for _ in range(ATTEMPTS):
            try:
                return self.repository.get(name, version)
            except NotFoundError:
                if name in self.repository.names():
                    raise  # loaded, without that version
            await self.wait(name, deadline)
        raise OverloadedError(f"model {name!r} was unloaded to make room as it loaded; try again")

    async def wait(self, name: str, deadline: Deadline | None) -> None:
        """Until ``name`` is loaded (by this request, or by the one already loading it)."""
        task = self._loading.get(name)
        if task is None:
            self.repository.check_name(name)  # 404 before anything is loaded or unloaded
            task = asyncio.get_running_loop().create_task(self._load(name))
            self._loading[name] = task
            task.add_done_callback(lambda done: self._loaded(name, done))
        began = time.perf_counter_ns()
        try:
            timeout = None if deadline is None else max(0.0, deadline.seconds_left())
            await asyncio.wait_for(asyncio.shield(task), timeout)
        except TimeoutError:
            raise OverloadedError(
                f"model {name!r} is still loading: not loaded within the request's timeout "
                "(its 'timeout' parameter, else GELU_DEFAULT_TIMEOUT_US)"
            ) from None
        except ModelLoadError as exc:
            raise NotReadyError(f"model {name!r} cannot be loaded: {exc}") from None
        finally:
            waited = time.perf_counter_ns() - began
            self.metrics.load_waits.observe(waited / 1e9)
            residency = self.residency.setdefault(name, Residency())
            residency.waits += 1
            residency.wait_ns += waited

    def _loaded(self, name: str, task: asyncio.Task[None]) -> None:
        del self._loading[name]
        if not task.cancelled():
            task.exception()  # its waiters were told; one that timed out is not

    async def load(self, name: str) -> None:
        """Load (or reload) ``name`` now, within the budget: the repository API's load."""
        self.repository.check_name(name)
        await self._load(name)

    async def _load(self, name: str) -> None:
        began = time.perf_counter_ns()
        if self.max_models is not None:  # room first: a model too many is never opened
            await self._make_room(name, self.max_models - 1, None)
        try:
            await self.repository.load(name)
        finally:
            self.record()
        took = time.perf_counter_ns() - began
        self.metrics.loads.observe(took / 1e9)
        residency = self.residency.setdefault(name, Residency())
        residency.loads += 1
        residency.load_ns += took
        await self._make_room(name, self.max_models, self.max_bytes)
        self.record()

    async def _make_room(self, loading: str, models: int | None, size: int | None) -> None:
        """Unload the least recently used models until at most ``models`` are loaded, holding
        at most ``size`` bytes (None: any); never a pinned model or the one ``loading``. One
        another load has just opened is the most recently used, so the last to go."""
        repository = self.repository
        while True:
            loaded = repository.loaded()
            count_over = models is not None and len(loaded) > models
            bytes_over = size is not None and held(loaded) > size
            if not (count_over or bytes_over):
                return
            spared = self.pinned | {loading}
            candidates = [(used, n) for n, (used, _) in loaded.items() if n not in spared]
            if not candidates:
                budget = "GELU_MAX_LOADED_MODELS" if count_over else "GELU_MODEL_MEMORY_BYTES"
                raise OverloadedError(
                    f"no room to load {loading!r} within {budget}: every loaded model is pinned"
                )
            _, victim = min(candidates)
            reason = f"unloaded to make room for {loading!r} (least recently used)"
            if await repository.unload(victim, reason):  # another load may have been first
                logger.info("%s %s", victim, reason)
                self.metrics.evictions.labels(victim).inc()
                self.residency.setdefault(victim, Residency()).evictions += 1

    def record(self) -> None:
        """The loaded models' count and bytes, to /metrics."""
        loaded = self.repository.loaded()
        self.metrics.loaded_models.set(len(loaded))
        self.metrics.loaded_model_bytes.set(held(loaded))


def held(loaded: dict[str, tuple[int, int]]) -> int:
    """The bytes the loaded models' sessions hold, from ``ModelRepository.loaded()``."""
    return sum(size for _used, size in loaded.values())
