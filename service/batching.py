"""Dynamic batching: concurrent requests for one model gathered into one onnxruntime run.

As Triton's dynamic batcher: a batch closes when it holds ``max_batch_size`` samples or when its
first request has waited ``max_queue_delay_us`` (with no delay, an inline batch waits only
while requests keep arriving, below); requests are concatenated along the batch axis
and the outputs split back in order. A batch holds only requests that stack: the same
non-batch shape and datatype of every input (a model with a variable dim, ``dims: [ -1 ]``,
takes requests of several shapes; the others wait for the next batch). A request whose client
has gone (its future cancelled) is dropped before the run and never disturbs the others. Every
request taken into a batch is answered or failed on every path (``try``/``finally``): when a
run of several fails, each of its requests runs again alone, so one bad request fails alone and
no request waits forever (issue 62, item 2, "batch poisoning").

A model whose config.pbtxt gives Triton's scheduling policy (``dynamic_batching``'s
``priority_levels`` and queue policies, ``contract.model_config.SchedulingPolicy``) queues in
``Levels``: a queue per priority level, batches taken highest level first and each level in
arrival order, a level's ``max_queue_size`` refusing at once, and a request past its timeout
refused (REJECT) or put behind its level's requests still in time (DELAY). Without one, the
queue is one plain deque, and the path is as it was. Either way a request leaves the queue the
moment its client goes or its deadline passes (``Batcher._withdraw``), and one that has started
to run is never cut short. See docs/scheduling.md.

``Scheduler`` is the one run path of a model version, built for every version, batching on or
off: the core asks its ``run`` once per request and gets an answer or an error; it picks the
batcher, or a run of the request alone on the event loop or on a thread, as below, and its
``stop`` ends the batcher once the version has drained. Nothing else reads the batcher.

Where a batch runs depends on what it costs, timed when the version starts serving
(``Model.largest_batch_within``, in ``service.repository``):

- **inline**, on the event loop, for batches that cost no more than the service's inline bound
  (``GELU_INLINE_MAX_US``). For the first request of a batch, the batcher waits one loop
  iteration (or the queue delay), and with a zero delay more for as long as requests keep
  arriving (until ``PATIENCE`` iterations in a row bring none), then runs the batch: it holds
  every request parsed in between, which under load is most of the connections with a request
  in flight. The batcher looks, a callback per iteration, while every request of the batch
  awaits its answer: each request's await chain is resumed once (``Batcher._look``).
  When batches have held one request in a row, requests stop looking for company for a while,
  longer each time a look finds none (``QUIET_MS``): meanwhile ``Scheduler.run`` runs them as
  batching off does, without calling the batcher (``bypass``), so a lone client does not wait
  for company that never comes, nor pay the batcher's bookkeeping. Handing a
  10-40 µs run to a thread and waking the loop again costs more than the run itself; one
  inline run blocks the loop for at most the bound, and after each batch the loop serves I/O
  before the next.
- **on a worker thread** otherwise: the gathering task hands each batch to one of the model's
  instances (``instance_group`` count in ``config.pbtxt``, default 1; each a worker thread on
  the one onnxruntime session, whose ``run`` is thread-safe). onnxruntime releases the GIL, so
  runs proceed beside the event loop, and while every instance is busy the next batch gathers,
  so batches form under load even with a zero delay. While no company is found lately
  (``QUIET_MS``, as inline) and an instance is free with nothing queued, a request takes
  it at once, without the queue and the gathering task's turn: a lone client's request then
  costs what it costs with batching off (its run is hundreds of microseconds or more here,
  the gathering task's hand-off tens).
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Awaitable, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, NamedTuple, cast

import anyio.to_thread
import numpy as np

from contract.model_config import SchedulingPolicy
from service.alarm import Alarm
from service.errors import DeadlineExceededError, OverloadedError, ServiceError
from service.metrics import Metrics
from service.runtime import Model
from service.statistics import ModelStatistics
from service.tracing import RequestTrace, batch_of

Outputs = dict[str, np.ndarray]
# Inline, with no queue delay, a batch gathers until this many loop iterations in a row have
# brought no request: grpcio hands calls over a few iterations apart, where HTTP's requests of
# one burst come in consecutive ones (docs/performance.md, "The batcher's constants, and other
# measured choices").
PATIENCE = 8
# After the n-th look in a row for company that finds none (a batch of one request), requests
# run unbatched, without looking, for QUIET_MS[n - 1] milliseconds (the last entry from then
# on); a batch with company ends it. Timed rather than counted in requests, so a request that
# skips the look costs nothing to count (``Batcher.bypass``: one attribute read).
QUIET_MS = (0, 1, 2, 4, 8, 16, 32, 64)


# Where a request's timeout came from, as its error says.
SERVER_TIMEOUT = "the request's 'timeout' parameter, else GELU_DEFAULT_TIMEOUT_US"
POLICY_TIMEOUT = "its priority level's queue policy in config.pbtxt"
CLIENT_TIMEOUT = "its gRPC deadline"


class Deadline:
    """When a request must have started running: ``timeout_us`` after ``began_ns``
    (``time.perf_counter_ns``), as Triton's queue policy ``timeout``. Past it, the request is
    refused ("Request timeout expired", Triton's words), or under Triton's DELAY action
    (``delay``) only no longer eligible to time out: it waits on behind its level's requests
    still in time. ``source`` says where the timeout came from."""

    __slots__ = ("at_ns", "delay", "source", "timeout_us")

    def __init__(
        self, began_ns: int, timeout_us: int, delay: bool = False, source: str = SERVER_TIMEOUT
    ) -> None:
        self.timeout_us = timeout_us
        self.at_ns = began_ns + timeout_us * 1000
        self.delay = delay
        self.source = source

    def seconds_left(self) -> float:
        """Seconds until the deadline (negative once passed)."""
        return (self.at_ns - time.perf_counter_ns()) / 1e9

    def passed(self) -> bool:
        """Whether the deadline has passed."""
        return time.perf_counter_ns() > self.at_ns

    def check(self) -> None:
        """Raise ``error()`` once the deadline has passed, unless the request is delayed
        rather than refused."""
        if not self.delay and time.perf_counter_ns() > self.at_ns:
            raise self.error()

    def error(self) -> ServiceError:
        """What a request whose deadline passed in a queue is answered: 503 (gRPC's
        UNAVAILABLE), as Triton answers it; where it was its client's own deadline, gRPC's
        DEADLINE_EXCEEDED."""
        message = f"Request timeout expired: not started within {self.timeout_us} µs"
        if self.source == CLIENT_TIMEOUT:
            return DeadlineExceededError(f"{message} ({self.source})")
        return OverloadedError(f"{message} ({self.source}); the model is overloaded")


@dataclass(slots=True, eq=False)  # eq=False: found in a queue by identity (``remove``)
class _Request:
    inputs: dict[str, np.ndarray]
    size: int
    future: asyncio.Future[Outputs]
    enqueued: float = field(default_factory=time.perf_counter)
    deadline: Deadline | None = None
    expiry: asyncio.TimerHandle | None = None  # fails the request when its deadline passes
    trace: RequestTrace | None = None  # a traced request's stages (service.tracing)
    level: int = 1  # its priority level (``Levels``); 1 without levels
    delayed: bool = False  # past its timeout under DELAY: in its level's delayed queue


class _Lone(NamedTuple):
    """A request that looks for company outside the queue (``Batcher._look``): what it
    becomes queued with if company comes, and the future it awaits (None: run alone)."""

    inputs: dict[str, np.ndarray]
    size: int
    arrived: float
    deadline: Deadline | None
    trace: RequestTrace | None
    level: int
    future: asyncio.Future[Outputs | None]


class Levels:
    """Triton's priority queue (``scheduler_utils.cc``'s ``PriorityQueue``), for a model whose
    config.pbtxt gives a scheduling policy: a queue per priority level, 1 the highest, each
    with its queue policy (``contract.model_config.QueuePolicy``). Requests are taken highest
    level first, each level's in arrival order, then its delayed ones (past their timeout
    under DELAY, Triton's ``delayed_queue_``). A level holding its ``max_queue_size`` refuses
    the next request (``admit``).

    It answers what the batcher asks of its plain ``deque`` (truth, ``[0]``, ``popleft``,
    ``append``, ``appendleft``, ``extendleft``, ``remove``), so a model without a policy keeps
    the deque's C speed and the batcher one code path."""

    __slots__ = ("_count", "_delayed", "_limits", "_queues")

    def __init__(self, scheduling: SchedulingPolicy) -> None:
        levels = range(scheduling.levels + 1)  # index 0 unused: levels count from 1
        self._queues: list[deque[_Request]] = [deque() for _ in levels]
        self._delayed: list[deque[_Request]] = [deque() for _ in levels]
        self._limits = [0] * len(self._queues)
        for level in levels[1:]:
            policy = scheduling.policy(level)
            self._limits[level] = policy.max_queue_size if policy is not None else 0
        self._count = 0

    def __len__(self) -> int:
        return self._count

    def __iter__(self) -> Iterator[_Request]:
        """Every request held, level by level; each deque is copied in one step under the GIL,
        as the metrics' flushing thread reads them (``Batcher.waiting``)."""
        held: list[_Request] = []
        for queue, delayed in zip(self._queues, self._delayed, strict=True):
            held += tuple(queue)
            held += tuple(delayed)
        return iter(held)

    def held(self, level: int) -> int:
        """Requests waiting at ``level``, delayed ones included (Triton's ``Size``)."""
        return len(self._queues[level]) + len(self._delayed[level])

    def admit(self, level: int, request_id: str | None) -> None:
        """Pass, or ``OverloadedError`` in Triton's words if ``level``'s queue is full."""
        limit = self._limits[level]
        if limit and self.held(level) >= limit:
            raise OverloadedError(
                f"[request id: {request_id or '<id_unknown>'}] Exceeds maximum queue size: "
                f"priority level {level} holds {limit} requests, its max_queue_size "
                "(config.pbtxt); try again shortly"
            )

    def _first(self) -> deque[_Request]:
        for queue, delayed in zip(self._queues, self._delayed, strict=True):
            if queue:
                return queue
            if delayed:
                return delayed
        raise IndexError("no request is queued")

    def __getitem__(self, index: int) -> _Request:
        if index != 0:
            raise IndexError("only the first request is looked at")
        return self._first()[0]

    def popleft(self) -> _Request:
        """The next request: the highest level's first."""
        request = self._first().popleft()
        self._count -= 1
        return request

    def _own(self, request: _Request) -> deque[_Request]:
        return (self._delayed if request.delayed else self._queues)[request.level]

    def append(self, request: _Request) -> None:
        """``request`` last of its level."""
        self._own(request).append(request)
        self._count += 1

    def appendleft(self, request: _Request) -> None:
        """``request`` first of its level (of its delayed ones, if delayed)."""
        self._own(request).appendleft(request)
        self._count += 1

    def extendleft(self, requests: Iterable[_Request]) -> None:
        """Each of ``requests`` first of its level, in turn (the last given ends first)."""
        for request in requests:
            self.appendleft(request)

    def remove(self, request: _Request) -> None:
        """``request`` out of its queue; ``ValueError`` if it is not there."""
        self._own(request).remove(request)
        self._count -= 1

    def delay(self, request: _Request) -> None:
        """``request``, taken past its timeout under DELAY, last of its level's delayed ones:
        it no longer times out."""
        request.delayed, request.deadline = True, None
        self.append(request)


def _asked(results: Outputs, outputs: list[str] | None) -> Outputs:
    """The outputs a request asked for by name, or all of them."""
    return {n: results[n] for n in outputs} if outputs else results


def _stacks(first: dict[str, np.ndarray], other: dict[str, np.ndarray]) -> bool:
    """Whether ``other``'s inputs stack onto ``first``'s along the batch axis: the same
    names, and for each the same non-batch shape and datatype (issue 62, item 2: requests of
    shapes [1, 3] and [1, 5] for a variable dim never share a run)."""
    if len(first) != len(other):
        return False
    for name, array in other.items():
        given = first.get(name)
        if given is None or given.shape[1:] != array.shape[1:] or given.dtype != array.dtype:
            return False
    return True


def _settle(batch: list[_Request], error: BaseException | None = None) -> None:
    """Fail every request of ``batch`` that has no answer yet, with ``error`` (None: that its
    batch ended without one): the last word of every path that took requests from the queue,
    so none of them waits forever."""
    for request in batch:
        if not request.future.done():
            request.future.set_exception(
                error or RuntimeError("its batch ended without an answer for this request")
            )


def _each_alone(model: Model, feeds: list[dict[str, np.ndarray]]) -> list[Any]:
    """``timed_infer`` of each feed in turn, or the exception its run raised: a failed batch's
    requests run again one by one, so only the requests that fail on their own fail."""
    answers: list[Any] = []
    for feed in feeds:
        try:
            answers.append(timed_infer(model, feed))
        except Exception as exc:
            answers.append(exc)
    return answers


def timed_infer(
    model: Model, feed: dict[str, np.ndarray], deadline: Deadline | None = None
) -> tuple[Outputs, int, int]:
    """``model.infer(feed)``, when the run began and how long it took (ns); refused if
    ``deadline`` has passed by the time the run would begin."""
    if deadline is not None:
        deadline.check()
    began = time.perf_counter_ns()
    results = model.infer(feed)
    return results, began, time.perf_counter_ns() - began


class Runs:
    """Where one model version's runs are counted: Triton's statistics and the Prometheus
    histograms. Its batcher and its requests that run unbatched count through the same one, so a
    run counts the same whichever path took it."""

    __slots__ = ("batch_size", "compute", "statistics")

    def __init__(self, model: Model, metrics: Metrics) -> None:
        self.statistics = ModelStatistics()
        # Children looked up once: labels() takes a lock and builds a key on every call.
        self.batch_size = metrics.batch_size.labels(model.name)
        self.compute = metrics.compute.labels(model.name, model.version)

    def record(
        self, samples: int, requests: int, input_ns: int, infer_ns: int, output_ns: int
    ) -> None:
        """One onnxruntime run of ``samples`` samples for ``requests`` requests, and its phases."""
        self.statistics.record_run(samples, requests, input_ns, infer_ns, output_ns)
        self.batch_size.observe(samples)
        self.compute.observe(infer_ns / 1e9)

    def record_alone(self, samples: int, queued_ns: int, infer_ns: int) -> None:
        """One request run on its own, ``queued_ns`` after it was handed on: as Triton's, every
        request's wait counts in the queue statistics, batched or not."""
        self.statistics.queue.add(queued_ns)
        self.statistics.record_run(samples, 1, 0, infer_ns, 0)
        self.batch_size.observe(samples)  # as record's, one call fewer on the unbatched path
        self.compute.observe(infer_ns / 1e9)


class Batching(NamedTuple):
    """How a version batches (``Scheduler.batching``)."""

    max_batch_size: int  # the largest batch
    inline: bool  # whether its batches run on the event loop
    instances: int  # batches running at once on worker threads


class Scheduler:
    """One per model version, batching on or off: every way its requests run. The core asks
    ``run`` once per request and gets the outputs or an error, never a wait without end;
    ``stop`` ends it once the version has drained. As Triton's dynamic batch scheduler, it
    picks the batcher, or a run of the request alone on the event loop or on a thread."""

    __slots__ = ("_batcher", "inline_batch", "model", "runs")

    def __init__(
        self,
        model: Model,
        runs: Runs,
        metrics: Metrics,
        inline_batch: int = 0,
        max_batch_size: int = 0,
        max_queue_delay_us: int = 0,
        instances: int = 1,
        scheduling: SchedulingPolicy | None = None,
    ) -> None:
        """``inline_batch``: the largest batch run on the event loop (0: always on a thread);
        ``max_batch_size`` 0 for a version that does not batch. A batcher's inline batches stay
        within the inline bound; a larger request runs on a thread. ``scheduling``: the
        batcher's priority levels and queue policies (``Levels``), None for one plain queue."""
        self.model = model
        self.runs = runs
        self.inline_batch = inline_batch
        self._batcher: Batcher | None = None
        if max_batch_size:
            size = min(max_batch_size, inline_batch) if inline_batch else max_batch_size
            self._batcher = Batcher(
                model, size, max_queue_delay_us, metrics, runs, inline_batch > 0, instances,
                scheduling,
            )  # fmt: skip

    @property
    def batching(self) -> Batching | None:
        """How its batcher batches; None when the version does not batch."""
        batcher = self._batcher
        if batcher is None:
            return None
        return Batching(batcher.max_batch_size, batcher.inline, batcher.instances)

    def start(self) -> None:
        """Start taking requests; call from the running event loop."""
        if self._batcher is not None:
            self._batcher.start()

    def waiting(self) -> int:
        """Its requests that have not started to run (``Batcher.waiting``). A request run
        alone counts as started once handed to the loop or to the thread pool, where past
        the pool's threads (anyio's 40, for the process) it may still wait, uncounted."""
        batcher = self._batcher
        return 0 if batcher is None else batcher.waiting()

    async def stop(self) -> None:
        """Stop, once the version has drained (the repository waits for its requests in
        flight): batches already running finish, a request still waiting fails, the worker
        threads are released. A request that comes after runs alone, as batching off does,
        and is answered by its run (an error, once the model is closed): never a wait for a
        batch that cannot come."""
        batcher, self._batcher = self._batcher, None
        if batcher is not None:
            await batcher.stop()

    def run(
        self,
        inputs: dict[str, np.ndarray],
        size: int,
        outputs: list[str] | None = None,
        deadline: Deadline | None = None,
        trace: RequestTrace | None = None,
        level: int = 1,
        request_id: str | None = None,
    ) -> Awaitable[Outputs]:
        """One checked request of ``size`` samples, answered with the outputs it asks for
        (None: all), or its error; never left waiting. ``level`` is its priority level (1
        without levels); ``request_id`` its V2 ``id``, which a refusal names as Triton's do.

        The batcher takes it when the version batches and the batcher runs where this request
        belongs (on the event loop up to ``inline_batch`` samples, else on a thread) and is not
        in a quiet (``Batcher.bypass``: no company lately); otherwise it runs alone, on the
        loop within the inline bound or on a worker thread, counted in the same statistics.
        What it returns is the batcher's own coroutine, not one more around it: a coroutine
        frame per request is about 1 % of the small model's request at c=64."""
        batcher = self._batcher
        inline = size <= self.inline_batch
        if batcher is not None and not batcher.bypass and inline is batcher.inline:
            return batcher.infer(inputs, outputs, deadline, trace, level, request_id)
        return self._alone(inputs, size, inline, outputs, deadline, trace)

    async def _alone(
        self,
        inputs: dict[str, np.ndarray],
        size: int,
        inline: bool,
        outputs: list[str] | None,
        deadline: Deadline | None,
        trace: RequestTrace | None,
    ) -> Outputs:
        handed = time.perf_counter_ns()
        if inline:  # bounded: see ModelRepository._inline_limit
            results, began, took = timed_infer(self.model, inputs)
        else:  # onnxruntime releases the GIL: the run proceeds beside the loop
            results, began, took = await anyio.to_thread.run_sync(
                timed_infer, self.model, inputs, deadline
            )
        self.runs.record_alone(size, began - handed, took)
        if trace is not None:
            trace.ran(handed, began, took, None)
        return _asked(results, outputs)


class Batcher:
    """One per model version: a queue, and runs on the event loop or on worker threads."""

    def __init__(
        self,
        model: Model,
        max_batch_size: int,
        max_queue_delay_us: int,
        metrics: Metrics,
        runs: Runs,
        inline: bool = False,
        instances: int = 1,
        scheduling: SchedulingPolicy | None = None,
    ) -> None:
        self.model = model
        self.runs = runs
        self._variable = any(d < 0 for t in model.inputs for d in t.dims)  # see _take
        self._queue_time = metrics.queue_time.labels(model.name)  # only a batcher queues
        self.max_batch_size = max_batch_size
        self.max_delay = max_queue_delay_us / 1e6
        self.inline = inline
        # Its queue: one plain deque, or with a scheduling policy, a queue per priority level.
        self._levels = Levels(scheduling) if scheduling is not None else None
        self._pending: deque[_Request] | Levels = deque() if self._levels is None else self._levels
        self._loop: asyncio.AbstractEventLoop | None = None
        self._queued = 0  # samples in _pending
        self._gathering = False  # inline: a request is leading a batch
        self._looking = False  # inline: a lone request, not queued, looks for company
        self._turn: asyncio.Handle | None = None  # inline: the look's next iteration
        self._lone: _Lone | None = None  # inline: the lone leader of the look, if any
        self._seen = 0  # inline, looking: samples queued at the last iteration
        self._idle = 0  # inline, looking: iterations in a row that brought no request
        self._gathered: list[_Request] = []  # on threads: the batch gathering, not yet running
        # No company found lately (QUIET_MS): requests do not look for it. ``bypass``, the same
        # inline, tells ``Scheduler.run`` to run them alone, as batching off does; on threads,
        # ``infer`` hands each to a free instance at once.
        self.quiet = False
        self.bypass = False
        self._lonely = 0  # looks in a row that found no company, up to len(QUIET_MS)
        self._listen_at: asyncio.TimerHandle | None = None  # ends the quiet
        self._scheduled: asyncio.Handle | None = None  # inline: a run for what is left
        self._wakeup = asyncio.Event()
        self._alarm: Alarm | None = None  # ends the queue delay (sets _wakeup) when there is one
        self._executor: ThreadPoolExecutor | None = None
        self.instances = instances  # batches running at once on worker threads
        self._instances = asyncio.Semaphore(instances)
        self._running: set[asyncio.Future[Any]] = set()  # runs on worker threads
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        """Start batching; call from the running event loop."""
        self._loop = asyncio.get_running_loop()
        if self.max_delay:
            # Inline, it ends the look (``_look``); on threads, it wakes the gathering task.
            self._alarm = Alarm(self._loop, self._looked if self.inline else self._wakeup.set)
        if not self.inline:
            self._executor = ThreadPoolExecutor(
                self.instances, thread_name_prefix=f"batch-{self.model.name}"
            )
            self._task = self._loop.create_task(self._gather_forever())

    async def stop(self) -> None:
        """Stop batching: batches already running finish, what is still queued fails, the
        worker threads are released."""
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        await asyncio.gather(*self._running, return_exceptions=True)  # batches already running
        if self._scheduled is not None:
            self._scheduled.cancel()
        self._stop_looking()
        self._listen()
        while self._pending:
            request = self._pending.popleft()
            if not request.future.done():
                request.future.set_exception(RuntimeError("the service is shutting down"))
        self._queued = 0
        if self._alarm is not None:
            self._alarm.close()
            self._wakeup.set()  # a queue delay still waited ends now
        if self._executor is not None:
            self._executor.shutdown(wait=True)

    def waiting(self) -> int:
        """Requests taken that have not started to run: queued, in a batch still gathering
        for a worker thread, or looking for company (Triton's pending count); not those
        already answered while they wait (their client left, or their deadline passed),
        which the next batch drops. Read when metrics are scraped, from what holds the
        requests anyway: counting nothing per request, it cannot drift from them. Copied
        first (one step under the GIL), as the metrics' flushing thread may read it."""
        held = (*self._pending, *self._gathered)
        return sum(not r.future.done() for r in held) + self._looking

    async def infer(
        self,
        inputs: dict[str, np.ndarray],
        outputs: list[str] | None = None,
        deadline: Deadline | None = None,
        trace: RequestTrace | None = None,
        level: int = 1,
        request_id: str | None = None,
    ) -> Outputs:
        """Queue one request and wait for its share of a batch's outputs; a request still
        queued at its ``deadline`` fails with ``OverloadedError`` instead of running late (or,
        delayed, waits on: ``Deadline.delay``). With priority levels it waits at ``level``,
        refused at once when that level's queue is full (``Levels.admit``). A request whose
        client leaves (its task cancelled) leaves the queue at once, and never runs."""
        loop = self._loop
        assert loop is not None, "Batcher.start() first"
        size = len(next(iter(inputs.values())))
        if self._levels is not None:
            self._levels.admit(level, request_id)
        if self.inline and not self._pending and not self._gathering:
            arrived = time.perf_counter()
            looks = not self.quiet  # in a quiet only a caller that ignores ``bypass`` comes here
            if looks:
                lone = _Lone(inputs, size, arrived, deadline, trace, level, loop.create_future())
                self._look(lone)
                try:
                    answer = await lone.future
                except asyncio.CancelledError:  # this client left: the others are waiting
                    self._lone_left(lone)
                    raise
                if answer is not None:  # it ran with the company that came
                    return _asked(answer, outputs)
            # in a quiet, or none came: a batch of this request alone
            return _asked(self._run_alone(inputs, size, arrived, looks, trace), outputs)
        if not self.inline and self.quiet and not self._pending and not self._instances.locked():
            results = await self._run_alone_on_thread(inputs, size, deadline, trace)
            return _asked(results, outputs)
        future: asyncio.Future[Outputs] = loop.create_future()
        request = _Request(inputs, size, future, deadline=deadline, trace=trace, level=level)
        self._pending.append(request)
        self._queued += size
        if not self.inline:
            # Inline, a request waits while its batch gathers (_look); on threads, behind
            # batches, for as long as its deadline allows (a delayed one, for as long as it takes).
            if deadline is not None and not deadline.delay:
                request.expiry = loop.call_later(deadline.seconds_left(), self._expire, request)
            self._wakeup.set()
        elif self._queued >= self.max_batch_size:
            self._run_inline()  # full: run now, in this request's turn
        elif not self._gathering:
            if self.quiet:  # no company lately: do not wait a loop iteration for none
                self._run_inline()
            else:
                self._look()
        try:
            results = await future
        except asyncio.CancelledError:  # the client left: out of the queue, if still there
            self._withdraw(request)
            raise
        return _asked(results, outputs)

    def _withdraw(self, request: _Request) -> None:
        """A queued request whose client left, or whose deadline passed, out of the queue at
        once (not when a batch would have reached it): it no longer holds a place that
        ``max_queue_size`` counts, nor samples that a batch gathers for. Taken meanwhile, it
        is already out (and dropped from its batch, its future being done)."""
        if request.expiry is not None:
            request.expiry.cancel()
            request.expiry = None
        try:
            self._pending.remove(request)
        except ValueError:
            return
        self._queued -= request.size

    def _expire(self, request: _Request) -> None:
        """A queued request's timer rang: past its deadline, it fails and leaves the queue.
        The loop's timers count milliseconds (``service.alarm``) and uvloop's round to the
        nearest, so a timer that rang before the deadline is set again for what is left: no
        request fails before its time."""
        deadline = request.deadline
        if deadline is None or request.future.done():
            return
        left = deadline.seconds_left()
        if left >= 0:
            assert self._loop is not None
            request.expiry = self._loop.call_later(left, self._expire, request)
            return
        self._withdraw(request)
        request.future.set_exception(deadline.error())

    # ---- inline --------------------------------------------------------------------------------

    def _look(self, lone: _Lone | None = None) -> None:
        """Look for company for the batch that a request leads, first of it: the others get
        their turn on the loop for the queue delay; with none, for iterations as long as
        requests keep coming, until ``PATIENCE`` in a row bring none or the batch is full:
        under load, the requests of the connections in flight are parsed over a few
        iterations, not one. The loop serves I/O in every iteration waited, and the wait ends
        within ``max_batch_size`` samples; a lone client, whom no iteration brings company,
        waits ``PATIENCE`` + 1 of them.

        The batcher looks, in a callback per iteration (``_looked``), not the leading
        request: a request's await chain (the face's frames down to here, ten on gRPC) is
        resumed once, when its answer comes, not once per iteration looked. The look's end
        runs the batch. A ``lone`` leader, not queued, joins it first if company came, its
        future answered by the run; else it is told None, and runs alone (``infer``)."""
        loop = self._loop
        assert loop is not None
        self._gathering = True
        self._seen, self._idle = self._queued, 0
        if self._alarm is not None:
            self._alarm.set(self.max_delay)
        else:
            self._turn = loop.call_soon(self._looked)
        self._lone = lone
        self._looking = lone is not None  # waiting outside the queue (``waiting``)

    def _looked(self) -> None:
        """An iteration of the look has passed (or its queue delay): on, while requests keep
        coming and the batch has room, else its end. A full batch that ran meanwhile (a
        request's own turn) leaves fewer queued, and ends it."""
        self._turn = None
        if not self._gathering:  # ended meanwhile (its leader left, the batcher stopped)
            return
        queued = self._queued
        if not self.max_delay and self._seen <= queued < self.max_batch_size:
            self._idle = self._idle + 1 if queued == self._seen else 0
            if self._idle < PATIENCE:
                self._seen = queued
                assert self._loop is not None
                self._turn = self._loop.call_soon(self._looked)
                return
        lone, self._lone = self._lone, None
        self._gathering = self._looking = False
        if lone is not None and not lone.future.cancelled():  # cancelled: its client left
            if not self._pending:  # none came: it runs alone, on its turn
                lone.future.set_result(None)
                return
            answered = cast("asyncio.Future[Outputs]", lone.future)  # by a run, from now on
            request = _Request(lone.inputs, lone.size, answered, lone.arrived, lone.deadline)
            request.trace, request.level = lone.trace, lone.level
            self._pending.appendleft(request)  # first of its level, as it came first
            self._queued += lone.size
        self._run_inline()

    def _stop_looking(self) -> None:
        """End the look now, running nothing; a lone leader still waiting runs alone."""
        if self._turn is not None:
            self._turn.cancel()
            self._turn = None
        lone, self._lone = self._lone, None
        if lone is not None and not lone.future.done():
            lone.future.set_result(None)
        self._gathering = self._looking = False

    def _lone_left(self, lone: _Lone) -> None:
        """A lone leader's client left: while it looks, the look ends and what came runs now;
        once queued (with levels, it may still be), it leaves the queue."""
        if self._lone is lone:
            self._stop_looking()
            self._run_inline()
            return
        for request in tuple(self._pending):
            if request.future is lone.future:
                self._withdraw(request)
                return

    def _run_alone(
        self,
        inputs: dict[str, np.ndarray],
        size: int,
        arrived: float,
        looked: bool,
        trace: RequestTrace | None = None,
    ) -> Outputs:
        """A batch of this one request, now, without queueing it; it has waited since
        ``arrived`` (``time.perf_counter``), for company if it ``looked`` (and found none)."""
        if looked:
            self._ran(1)
        waited = time.perf_counter() - arrived
        self._queue_time.observe(waited)
        results, began, infer_ns = timed_infer(self.model, inputs)
        self.runs.record_alone(size, int(waited * 1e9), infer_ns)
        if trace is not None:
            trace.ran(int(arrived * 1e9), began, infer_ns, None)
        return results

    def _run_inline(self) -> None:
        """One batch, on the loop; the rest of the queue waits for the next loop iteration.
        Every request taken is answered or failed here, whatever happens."""
        batch = self._take([])
        try:
            if batch:
                self._ran(len(batch))
                start = time.perf_counter_ns()
                feed = self._feed(batch)
                try:
                    results, began, took = timed_infer(self.model, feed)
                except Exception:
                    if len(batch) == 1:
                        raise
                    self._answer_alone(batch, _each_alone(self.model, [r.inputs for r in batch]))
                else:
                    self._split_and_record(batch, results, start, began, took)
        except Exception as exc:
            _settle(batch, exc)
        finally:
            _settle(batch)
            if self._pending and self._scheduled is None and self._loop is not None:
                self._scheduled = self._loop.call_soon(self._run_scheduled)

    def _ran(self, requests: int) -> None:
        """Count a batch of ``requests``. One with company ends the quiet, if any: the next
        request looks for company again. A batch of one is a look that found none: the n-th in a
        row starts a quiet of ``QUIET_MS[n - 1]`` ms, during which requests run without looking
        (inline, their callers run them, ``bypass``; on threads, ``infer`` hands each to a free
        instance at once)."""
        if requests > 1:
            self._lonely = 0
            if self.quiet:
                self._listen()
            return
        self._lonely = min(self._lonely + 1, len(QUIET_MS))
        quiet_ms = QUIET_MS[self._lonely - 1]
        if quiet_ms and self._loop is not None:
            if self._listen_at is not None:
                self._listen_at.cancel()
            self.quiet, self.bypass = True, self.inline
            self._listen_at = self._loop.call_later(quiet_ms / 1000, self._listen)

    def _listen(self) -> None:
        """End the quiet: the next request looks for company."""
        if self._listen_at is not None:
            self._listen_at.cancel()
            self._listen_at = None
        self.quiet = self.bypass = False

    def _run_scheduled(self) -> None:
        self._scheduled = None
        self._run_inline()

    # ---- on a worker thread --------------------------------------------------------------------

    async def _gather_forever(self) -> None:
        """Gather a batch whenever one of the model's instances is free, and run it there.
        Requests taken from the queue are answered by the run, or failed here if it never
        starts (the batcher stopping while a batch gathers)."""
        loop = asyncio.get_running_loop()
        while True:
            if not self._pending:
                self._wakeup.clear()
                await self._wakeup.wait()
            await self._instances.acquire()
            batch: list[_Request] = []
            self._gathered = batch  # its requests wait until its run starts (``waiting``)
            try:
                await self._gather(batch)
                batch = [r for r in batch if not r.future.done()]  # gone meanwhile
                if batch:
                    self._ran(len(batch))
                    run = loop.create_task(self._run_on_thread(batch))  # releases the instance
                    self._running.add(run)
                    run.add_done_callback(self._running.discard)
                    continue
            except asyncio.CancelledError:
                _settle(batch, RuntimeError("the service is shutting down"))
                raise
            except Exception as exc:
                _settle(batch, exc)
            finally:
                self._gathered = []
            self._instances.release()

    async def _run_alone_on_thread(
        self,
        inputs: dict[str, np.ndarray],
        size: int,
        deadline: Deadline | None,
        trace: RequestTrace | None = None,
    ) -> Outputs:
        """A batch of this one request on the free instance, now: no queue entry, no future of
        its own, no turn of the gathering task. A client that leaves meanwhile leaves the run to
        finish on its thread, holding the instance until then."""
        await self._instances.acquire()  # free (the caller checked): returns at once
        handed = time.perf_counter_ns()
        run = asyncio.get_running_loop().run_in_executor(
            self._executor, timed_infer, self.model, inputs, deadline
        )
        self._running.add(run)
        run.add_done_callback(self._ran_alone)
        results, began, took = await asyncio.shield(run)
        self.runs.record_alone(size, began - handed, took)
        if trace is not None:
            trace.ran(handed, began, took, None)
        return results

    def _ran_alone(self, run: asyncio.Future[Any]) -> None:
        self._running.discard(run)
        self._instances.release()

    async def _run_on_thread(self, batch: list[_Request]) -> None:
        """One batch on a worker thread; every request of it is answered or failed here,
        whatever happens, and the instance is free again."""
        loop = asyncio.get_running_loop()
        try:
            start = time.perf_counter_ns()
            feed = self._feed(batch)
            try:
                results, began, took = await loop.run_in_executor(
                    self._executor, timed_infer, self.model, feed
                )
            except Exception:
                if len(batch) == 1:
                    raise
                feeds = [r.inputs for r in batch]
                answers = await loop.run_in_executor(self._executor, _each_alone, self.model, feeds)
                self._answer_alone(batch, answers)
            else:
                self._split_and_record(batch, results, start, began, took)
        except Exception as exc:
            _settle(batch, exc)
        finally:
            _settle(batch)
            self._instances.release()

    async def _gather(self, batch: list[_Request]) -> None:
        """Take requests into ``batch`` until it is full or its first request's delay is
        spent."""
        while True:
            self._take(batch)
            full = self._size(batch) >= self.max_batch_size or (self._pending and batch)
            remaining = batch[0].enqueued + self.max_delay - time.perf_counter() if batch else 0
            if full or remaining <= 0:  # with no delay, at once
                return
            assert self._alarm is not None  # a delay: wait for its end, or another request
            await self._delay(self._alarm, remaining)

    # ---- shared --------------------------------------------------------------------------------

    async def _delay(self, alarm: Alarm, seconds: float) -> None:
        """Wait ``seconds`` (to the microsecond, ``service.alarm``), or less if a request
        arrives meanwhile on a worker-thread batcher (whose ``infer`` sets ``_wakeup``)."""
        self._wakeup.clear()
        alarm.set(seconds)
        await self._wakeup.wait()

    def _take(self, batch: list[_Request]) -> list[_Request]:
        """Move queued requests that stack onto ``batch`` (``_stacks``: its first request's
        non-batch shapes and datatypes) into it, in order, while they fit; the others keep
        their place for a later batch. A request larger than the batch limit runs alone rather
        than waiting forever. Departed clients are dropped."""
        pending, size, limit = self._pending, self._size(batch), self.max_batch_size
        # Checked requests of a model whose dims are all fixed always stack: compare only when
        # a dim is variable (-1), so the common batch pays nothing for it.
        first = batch[0].inputs if batch and self._variable else None
        skipped: list[_Request] = []  # of other shapes: the next batch's
        while pending and size < limit:
            request = pending[0]
            if first is not None and not _stacks(first, request.inputs):
                skipped.append(pending.popleft())
                continue
            if batch and size + request.size > limit:
                break
            pending.popleft()
            self._queued -= request.size
            deadline = request.deadline
            if deadline is not None:
                if request.expiry is not None:  # a timer rings on the loop's schedule
                    request.expiry.cancel()
                if deadline.passed() and not request.future.done():  # inline ones have no timer
                    if deadline.delay:  # Triton's DELAY: behind its level's requests in time
                        assert self._levels is not None  # only a queue policy delays
                        self._levels.delay(request)
                        self._queued += request.size
                        continue
                    request.future.set_exception(deadline.error())
            if request.future.done():  # the client went away, or its deadline passed
                continue
            batch.append(request)
            size += request.size
            if first is None and self._variable:
                first = request.inputs
        if skipped:
            pending.extendleft(reversed(skipped))
        return batch

    @staticmethod
    def _size(batch: list[_Request]) -> int:
        return sum(r.size for r in batch)

    def _split_and_record(
        self, batch: list[_Request], results: Outputs, start: int, began: int, infer_ns: int
    ) -> None:
        """Each request's share of ``results``; the run's three phases recorded (the batch
        was fed from ``start`` and ran from ``began``, perf ns), and traced requests told."""
        split = time.perf_counter_ns()
        self._split(batch, results)
        output_ns = time.perf_counter_ns() - split
        samples = self._size(batch)
        self.runs.record(samples, len(batch), began - start, infer_ns, output_ns)
        traced = [r for r in batch if r.trace is not None]
        if traced:
            self._traced(traced, len(batch), samples, began, infer_ns)

    def _traced(
        self, traced: list[_Request], requests: int, samples: int, began: int, infer_ns: int
    ) -> None:
        """A run's traced requests: their queue and compute, and the batch span they share."""
        traces = [r.trace for r in traced if r.trace is not None]
        model = self.model
        attributes = {"triton.model_name": model.name, "triton.model_version": model.version,
                      "gelu.batch_size": samples, "gelu.batch_requests": requests,
                      "gelu.execution_provider": model.providers[0]}  # fmt: skip
        shared = batch_of(traces, began, infer_ns, attributes) if requests > 1 else None
        for request, trace in zip(traced, traces, strict=True):
            trace.ran(int(request.enqueued * 1e9), began, infer_ns, shared)

    def _feed(self, batch: list[_Request]) -> dict[str, np.ndarray]:
        """The batch's inputs, concatenated; records the requests' queue times."""
        started = time.perf_counter()
        queue_time, queue = self._queue_time, self.runs.statistics.queue
        for request in batch:
            waited = started - request.enqueued
            queue_time.observe(waited)
            queue.add(int(waited * 1e9))
        if len(batch) == 1:
            return batch[0].inputs
        return {n: np.concatenate([r.inputs[n] for r in batch]) for n in batch[0].inputs}

    @staticmethod
    def _split(batch: list[_Request], results: Outputs) -> None:
        if len(batch) == 1:
            if not batch[0].future.done():
                batch[0].future.set_result(results)
            return
        offset = 0
        for request in batch:
            end = offset + request.size
            if not request.future.done():
                request.future.set_result({n: a[offset:end] for n, a in results.items()})
            offset = end

    def _answer_alone(self, batch: list[_Request], answers: list[Any]) -> None:
        """Each request of a failed batch its own run's answer, or its own run's error
        (``_each_alone``); each run is recorded as a batch of one."""
        for request, answer in zip(batch, answers, strict=True):
            if isinstance(answer, Exception):
                if not request.future.done():
                    request.future.set_exception(answer)
                continue
            results, began, took = answer
            self._split_and_record([request], results, began, began, took)
