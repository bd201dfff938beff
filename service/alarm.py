"""A timer for the event loop that keeps microseconds: the batchers' queue delays.

The loop's own timers count milliseconds. uvloop (libuv) rounds a delay to the nearest one: a
300 µs ``asyncio.sleep`` returns at once and a 700 µs one takes about 1.1 ms. asyncio's
selector loop waits at least about 1.1 ms for any of them. Triton's
``max_queue_delay_microseconds`` is often a few hundred. An ``Alarm`` is a Linux timerfd that
the loop watches like a socket: the kernel's timer keeps nanoseconds, and the loop wakes when
the descriptor turns readable, whatever its own timers' resolution. Where there is no timerfd
(not Linux), it falls back to the loop's timer, with that timer's resolution.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import os
from collections.abc import Callable

CLOCK_MONOTONIC = 1  # time.perf_counter's clock on Linux


class _Timespec(ctypes.Structure):
    _fields_ = [("tv_sec", ctypes.c_long), ("tv_nsec", ctypes.c_long)]


class _Itimerspec(ctypes.Structure):
    _fields_ = [("it_interval", _Timespec), ("it_value", _Timespec)]


_libc = ctypes.CDLL(None, use_errno=True)
_timerfd_create = getattr(_libc, "timerfd_create", None)
_timerfd_settime = getattr(_libc, "timerfd_settime", None)


class Alarm:
    """Calls ``callback`` on ``loop`` once ``set(seconds)`` has passed (again at each ``set``;
    a later ``set`` replaces an earlier one). ``close`` it when done."""

    def __init__(self, loop: asyncio.AbstractEventLoop, callback: Callable[[], None]) -> None:
        self._loop = loop
        self._callback = callback
        self._fd = -1
        self._handle: asyncio.TimerHandle | None = None
        if _timerfd_create is not None and _timerfd_settime is not None:
            fd = _timerfd_create(CLOCK_MONOTONIC, os.O_NONBLOCK | os.O_CLOEXEC)
            if fd >= 0:
                self._fd = fd
                loop.add_reader(fd, self._fired)

    @property
    def precise(self) -> bool:
        """Whether it keeps microseconds (a timerfd), rather than the loop's resolution."""
        return self._fd >= 0

    def set(self, seconds: float) -> None:
        """Ring once ``seconds`` from now (at once for none)."""
        if self._fd < 0:
            if self._handle is not None:
                self._handle.cancel()
            self._handle = self._loop.call_later(seconds, self._callback)
            return
        assert _timerfd_settime is not None  # there is a timerfd
        # A zero it_value disarms a timerfd: the nearest moment is 1 ns.
        nanoseconds = max(1, round(seconds * 1e9))
        spec = _Itimerspec(_Timespec(0, 0), _Timespec(*divmod(nanoseconds, 1_000_000_000)))
        if _timerfd_settime(self._fd, 0, ctypes.byref(spec), None) != 0:
            raise OSError(ctypes.get_errno(), "timerfd_settime failed")

    def close(self) -> None:
        """Stop watching; the alarm never rings again."""
        if self._handle is not None:
            self._handle.cancel()
        if self._fd >= 0:
            self._loop.remove_reader(self._fd)
            os.close(self._fd)
            self._fd = -1

    def _fired(self) -> None:
        with contextlib.suppress(BlockingIOError):  # re-armed before the loop read it
            os.read(self._fd, 8)  # the expiry count; reading it makes the fd quiet again
            self._callback()
