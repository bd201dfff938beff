"""Dynamic batching: concurrent requests for one model gathered into one onnxruntime run.

As Triton's dynamic batcher: a batch closes when it holds ``max_batch_size`` samples or when its
first request has waited ``max_queue_delay_us``; requests are concatenated along the batch axis
and the outputs split back in order. While a batch runs, the next one gathers, so under load
batches form even with a zero delay. A request whose client has gone (its future cancelled) is
dropped before the run and never disturbs the others; when a run fails, every request in it gets
the error.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import numpy as np

from service.metrics import Metrics
from service.runtime import Model


@dataclass
class _Request:
    inputs: dict[str, np.ndarray]
    size: int
    future: asyncio.Future[dict[str, np.ndarray]]
    enqueued: float = field(default_factory=time.perf_counter)


class Batcher:
    """One per model version: a queue, a gathering task and one worker thread."""

    def __init__(
        self, model: Model, max_batch_size: int, max_queue_delay_us: int, metrics: Metrics
    ) -> None:
        self.model = model
        self.max_batch_size = max_batch_size
        self.max_delay = max_queue_delay_us / 1e6
        self.metrics = metrics
        self._pending: deque[_Request] = deque()
        self._wakeup = asyncio.Event()
        self._executor = ThreadPoolExecutor(1, thread_name_prefix=f"batch-{model.name}")
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        """Start gathering; call from the running event loop."""
        self._task = asyncio.get_running_loop().create_task(self._gather_forever())

    async def stop(self) -> None:
        """Stop gathering, fail what is still queued, release the worker thread."""
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        while self._pending:
            request = self._pending.popleft()
            if not request.future.done():
                request.future.set_exception(RuntimeError("the service is shutting down"))
        self._executor.shutdown(wait=True)

    async def infer(
        self, inputs: dict[str, np.ndarray], outputs: list[str] | None = None
    ) -> dict[str, np.ndarray]:
        """Queue one request and wait for its share of a batch's outputs."""
        size = len(next(iter(inputs.values())))
        future: asyncio.Future[dict[str, np.ndarray]] = asyncio.get_running_loop().create_future()
        self._pending.append(_Request(inputs, size, future))
        self._wakeup.set()
        results = await future
        return {n: results[n] for n in outputs} if outputs else results

    async def _gather_forever(self) -> None:
        while True:
            if not self._pending:
                self._wakeup.clear()
                await self._wakeup.wait()
            await self._run(await self._gather())

    async def _gather(self) -> list[_Request]:
        """Take requests until the batch is full or its first request's delay is spent."""
        batch: list[_Request] = []
        size = 0
        deadline = None
        while True:
            # A request larger than the batch limit runs alone rather than waiting forever.
            while self._pending and (
                not batch or size + self._pending[0].size <= self.max_batch_size
            ):
                request = self._pending.popleft()
                if request.future.done():  # the client went away while queued
                    continue
                if deadline is None:
                    deadline = request.enqueued + self.max_delay
                batch.append(request)
                size += request.size
            full = size >= self.max_batch_size or (self._pending and batch)
            remaining = (deadline - time.perf_counter()) if deadline is not None else 0.0
            if full or remaining <= 0:
                return batch
            self._wakeup.clear()
            try:
                await asyncio.wait_for(self._wakeup.wait(), remaining)
            except TimeoutError:
                return batch

    async def _run(self, batch: list[_Request]) -> None:
        batch = [r for r in batch if not r.future.done()]  # clients gone while gathering
        if not batch:
            return
        started = time.perf_counter()
        for request in batch:
            self.metrics.queue_time.labels(self.model.name).observe(started - request.enqueued)
        names = list(batch[0].inputs)
        if len(batch) == 1:
            feed = batch[0].inputs
        else:
            feed = {n: np.concatenate([r.inputs[n] for r in batch]) for n in names}
        total = sum(r.size for r in batch)
        self.metrics.batch_size.labels(self.model.name).observe(total)
        loop = asyncio.get_running_loop()
        try:
            results = await loop.run_in_executor(self._executor, self.model.infer, feed)
        except Exception as exc:  # every request of a failed batch gets the error
            for request in batch:
                if not request.future.done():
                    request.future.set_exception(exc)
            return
        offset = 0
        for request in batch:
            end = offset + request.size
            if not request.future.done():
                request.future.set_result({n: a[offset:end] for n, a in results.items()})
            offset = end
