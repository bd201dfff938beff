"""bench.floor: the floors, served by uvicorn and as a bare ASGI app."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from bench.floor import BODY, create_asgi_app
from bench.proc import cpu_seconds, process_tree
from tests.servers import free_port, get, listening, wait_ready, wait_until

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow  # two real uvicorn workers
def test_the_floor_served_with_two_workers_spreads_connections_and_stops_on_sigterm() -> None:
    """``python -m bench.floor --http PORT 2``: both workers answer some of 32 connections (each
    on its own SO_REUSEPORT socket), and SIGTERM to the parent stops them all."""
    import http.client
    from concurrent.futures import ThreadPoolExecutor

    port = free_port()
    parent = subprocess.Popen([sys.executable, "-m", "bench.floor", "--http", str(port), "2"],
                              cwd=ROOT, text=True)  # fmt: skip

    def workers() -> list[int]:
        """The workers (not multiprocessing's tracker), once both listen on the port."""
        tree = process_tree(parent.pid)[1:]
        found = [pid for pid in tree if b"spawn_main" in Path(f"/proc/{pid}/cmdline").read_bytes()]
        return found if len(found) == 2 and listening(parent.pid, port) == 2 else []

    def client(_: int) -> list[int]:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
        statuses = []
        for _ in range(30):
            conn.request("POST", "/floor", body=b"{}")
            response = conn.getresponse()
            response.read()
            statuses.append(response.status)
        conn.close()
        return statuses

    try:
        wait_ready(port, parent, lambda port: get(port, "/docs")[0])
        pids = wait_until(workers, timeout=30, every=0.2, what="two workers listening")
        tree = process_tree(parent.pid)[1:]  # the workers and multiprocessing's tracker
        before = {pid: cpu_seconds(pid) for pid in pids}
        with ThreadPoolExecutor(32) as pool:
            assert {s for statuses in pool.map(client, range(32)) for s in statuses} == {200}
        busy = [pid for pid in pids if cpu_seconds(pid) - before[pid] >= 0.02]
        assert len(busy) == 2, {pid: cpu_seconds(pid) - before[pid] for pid in pids}
        parent.send_signal(signal.SIGTERM)
        assert parent.wait(timeout=30) == 0

        def gone() -> bool:  # the tracker leaves once the parent's pipe closes
            return not any(Path(f"/proc/{pid}").exists() for pid in tree)

        wait_until(gone, timeout=5, every=0.05, what=f"the tree {tree} to go")
    finally:
        if parent.poll() is None:
            for pid in reversed(process_tree(parent.pid)):
                os.kill(pid, signal.SIGKILL)
            parent.wait()


def test_the_asgi_floor_answers_the_floors_constant() -> None:
    import asyncio

    import httpx

    async def main() -> httpx.Response:
        transport = httpx.ASGITransport(app=create_asgi_app())
        async with httpx.AsyncClient(transport=transport, base_url="http://floor") as client:
            return await client.post("/floor", content=b'{"instances": [[0.5]]}')

    response = asyncio.run(main())
    assert response.status_code == 200 and response.content == BODY
    assert response.headers["content-type"] == "application/json"
