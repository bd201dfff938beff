"""A Kubernetes rolling update of the host (``service/host.py``: SIGTERM drains, readiness
first), simulated with two real `gelu-serve serve` processes and a client that follows their
readiness as a Service's endpoints do: the new server starts and turns ready, the old one is
sent SIGTERM while load runs, and no request is lost (docs/serving.md, "Readiness")."""

from __future__ import annotations

import http.client
import itertools
import json
import signal
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from service.host import STOPPED
from tests.helpers import DIGITS
from tests.servers import Server, free_port, get, start, wait_ready, wait_until

# The prober's period: Kubernetes' readinessProbe periodSeconds, scaled down with the drain
# (GELU_DRAIN_SECONDS must outlast a period plus the time endpoints take to follow it).
PROBE_S = 0.05
DRAIN_S = 1.0
CLIENTS = 4
ENV = {"GELU_DRAIN_SECONDS": str(DRAIN_S), "GELU_WARMUP_RUNS": "0"}
BODY = json.dumps(
    {
        "inputs": [
            {"name": "input", "shape": [1, 64], "datatype": "FP32", "data": DIGITS[0].tolist()}
        ]
    }
)


@dataclass
class Answer:
    """One request: the server it went to, its status (None: no answer, the request lost)."""

    port: int
    status: int | None
    sent: float
    answered: float


@dataclass
class Balancer:
    """The endpoints controller and the proxy in one: every ``PROBE_S`` the prober reads each
    server's /v2/health/ready, and each request goes, round robin, to a server whose readiness
    it last saw 200."""

    ports: list[int]
    ready: tuple[int, ...] = ()
    probes: dict[int, list[int | None]] = field(default_factory=dict)  # None: refused
    answers: list[Answer] = field(default_factory=list)
    stop: threading.Event = field(default_factory=threading.Event)
    _turn: itertools.count = field(default_factory=itertools.count)

    def probe_forever(self) -> None:
        while not self.stop.is_set():
            ready = []
            for port in list(self.ports):
                try:
                    status: int | None = get(port, "/v2/health/ready", timeout=2)[0]
                except OSError:
                    status = None
                self.probes.setdefault(port, []).append(status)
                if status == 200:
                    ready.append(port)
            self.ready = tuple(ready)
            self.stop.wait(PROBE_S)

    def send_forever(self) -> None:
        while not self.stop.is_set():
            ready = self.ready
            if not ready:
                time.sleep(PROBE_S)
                continue
            port = ready[next(self._turn) % len(ready)]
            sent, status = time.monotonic(), None
            connection = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
            try:
                connection.request("POST", "/v2/models/digits-mlp/infer", BODY,
                                   {"Content-Type": "application/json"})  # fmt: skip
                response = connection.getresponse()
                response.read()
                status = response.status
            except OSError:
                pass  # refused or reset: lost
            finally:
                connection.close()
            self.answers.append(Answer(port, status, sent, time.monotonic()))


@pytest.mark.slow
def test_a_rolling_update_loses_no_request(model_repository: Path) -> None:
    old_port, new_port = free_port(), free_port()
    old = start(model_repository, old_port, ENV)
    new: Server | None = None
    old_output = new_output = ""
    balancer = Balancer([old_port])
    threads = [threading.Thread(target=balancer.probe_forever)]
    threads += [threading.Thread(target=balancer.send_forever) for _ in range(CLIENTS)]
    try:
        wait_ready(old_port, old)
        for thread in threads:
            thread.start()
        wait_until(lambda: len(balancer.answers) > 20, what="load on the old server")
        new = start(model_repository, new_port, ENV)  # maxSurge 1: the new pod first
        balancer.ports.append(new_port)
        wait_until(lambda: new_port in balancer.ready, timeout=60, what="the new server ready")
        wait_until(lambda: any(a.port == new_port for a in balancer.answers), what="load on both")
        terminated = time.monotonic()
        old.send_signal(signal.SIGTERM)  # then the old pod goes
        old.wait(60)
        old_output = old.stop()
        exited = time.monotonic()
        count = len(balancer.answers)
        wait_until(lambda: len(balancer.answers) > count + 20, what="load on the new server")
    finally:
        balancer.stop.set()
        for thread in threads:
            if thread.is_alive():
                thread.join(60)
        if old.returncode is None:  # the test failed before the old server stopped
            old_output = old.stop()
        if new is not None:
            new_output = new.stop()
    assert old.returncode == 0, old_output
    assert "Traceback" not in old_output + new_output, old_output + new_output
    lost = [a for a in balancer.answers if a.status != 200]
    assert not lost, lost[:5]
    by_old = [a for a in balancer.answers if a.port == old_port]
    by_new = [a for a in balancer.answers if a.port == new_port]
    assert by_old and by_new and any(a.sent > exited for a in by_new)
    assert all(a.answered < exited for a in by_old)
    # Readiness went first: the old server answered 503 before it stopped listening.
    after = [s for s in balancer.probes[old_port] if s != 200]
    assert after and after[0] == 503 and after.count(503) >= 2, after[:5]
    lines = old_output.splitlines()
    draining = [i for i, line in enumerate(lines) if f"draining for {DRAIN_S:g} s" in line]
    done = [i for i, line in enumerate(lines) if STOPPED in line]
    assert len(draining) == 1 and len(done) == 1 and draining[0] < done[0], old_output
    assert exited - terminated >= DRAIN_S
    print(
        f"rolling update: {len(balancer.answers)} requests, {len(by_old)} to the old server, "
        f"{len(by_new)} to the new, 0 lost; the old one exited {exited - terminated:.2f} s "
        "after SIGTERM"
    )
