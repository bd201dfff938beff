"""The event loop's microsecond timer, on uvloop (as the service runs) and asyncio's loop."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Coroutine
from typing import Any

import pytest
import uvloop

from service import alarm as alarm_module
from service.alarm import Alarm

LOOPS: dict[str, Callable[[Coroutine[Any, Any, Any]], Any]] = {
    "uvloop": uvloop.run,
    "asyncio": asyncio.run,
}


async def rings_after(seconds: float, *, rearm_first: float | None = None) -> list[float]:
    """When an alarm set for ``seconds`` rang, after its set (seconds), each time it rang
    within 50 ms; with ``rearm_first``, it is first set for that and replaced at once."""
    loop = asyncio.get_running_loop()
    rang: list[float] = []
    alarm = Alarm(loop, lambda: rang.append(time.perf_counter()))
    try:
        if rearm_first is not None:
            alarm.set(rearm_first)
        began = time.perf_counter()
        alarm.set(seconds)
        await asyncio.sleep(0.05)
    finally:
        alarm.close()
    return [t - began for t in rang]


@pytest.mark.parametrize("loop", LOOPS)
def test_an_alarm_rings_once_and_not_before_its_time(loop: str) -> None:
    """300 µs, which uvloop's own timers round to nothing: the alarm keeps it."""
    (rang,) = LOOPS[loop](rings_after(300e-6))
    assert rang >= 300e-6


@pytest.mark.parametrize("loop", LOOPS)
def test_a_later_set_replaces_an_earlier_one(loop: str) -> None:
    (rang,) = LOOPS[loop](rings_after(2e-3, rearm_first=100e-6))
    assert rang >= 2e-3


def test_without_a_timerfd_the_loops_timer_rings(monkeypatch: pytest.MonkeyPatch) -> None:
    """Where there is no timerfd (not Linux), the loop's own timer, at its resolution."""

    async def check() -> list[float]:
        fallback = Alarm(asyncio.get_running_loop(), lambda: None)
        assert not fallback.precise
        fallback.close()
        return await rings_after(300e-6)

    monkeypatch.setattr(alarm_module, "_timerfd_create", None)
    assert len(asyncio.run(check())) == 1


def test_a_closed_alarm_never_rings() -> None:
    async def check() -> list[str]:
        rang: list[str] = []
        alarm = Alarm(asyncio.get_running_loop(), lambda: rang.append("rang"))
        assert alarm.precise  # Linux: a timerfd
        alarm.set(100e-6)
        alarm.close()
        await asyncio.sleep(0.01)
        return rang

    assert asyncio.run(check()) == []
