"""Drive one gRPC method: ``c`` calls in flight on one HTTP/2 channel, for a while, from its own
process (pinned like wrk); its figures come back as the JSON of ``bench.wrk.run_wrk``. For
Triton's ModelStreamInfer (``STREAM_METHOD``), ``c`` requests in flight on one call instead,
the next written as each answer is read.

A small grpcio asyncio client rather than ghz (npm holds only a placeholder, and no registry
here serves its binary): requests are serialized once and sent as bytes, responses kept as
bytes, so the client spends its time on the calls themselves. Against ``bench.floor``'s gRPC
floor (a constant answer) it runs several times faster than any gRPC point of the service, so
it is not what limits them; ``make bench`` records that floor beside them.

``python -m bench.grpc_load ADDRESS METHOD BODY_FILE CONCURRENCY SECONDS``
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import tempfile
import time
from collections import deque
from pathlib import Path
from typing import Any

import grpc

from bench.proc import client_command

STREAM_METHOD = "/inference.GRPCInferenceService/ModelStreamInfer"


async def drive(address: str, method: str, body: bytes, concurrency: int, seconds: float) -> dict:
    """Calls back to back from ``concurrency`` tasks (or requests on one stream); latencies
    and errors."""
    latencies: list[float] = []
    async with grpc.aio.insecure_channel(address) as channel:
        deadline = time.perf_counter() + seconds
        started, cpu = time.perf_counter(), time.process_time()
        if method == STREAM_METHOD:
            errors = await _stream(channel, body, concurrency, deadline, latencies)
        else:
            errors = await _calls(channel, method, body, concurrency, deadline, latencies)
        elapsed = time.perf_counter() - started
        cpu = time.process_time() - cpu
    latencies.sort()

    def percentile(q: float) -> float:
        if not latencies:
            return 0.0
        return latencies[min(len(latencies) - 1, int(q * len(latencies)))] * 1000

    return {
        "requests": len(latencies),
        "request_bytes": len(body),
        "rps": len(latencies) / elapsed,
        "p50_ms": percentile(0.50),
        "p99_ms": percentile(0.99),
        "errors": errors,
        # The client's own CPU over the calls (every thread, not its start-up): near 1 would
        # mean the client, not the server, set the pace.
        "client_cores": cpu / elapsed,
    }


async def _calls(
    channel: grpc.aio.Channel,
    method: str,
    body: bytes,
    concurrency: int,
    deadline: float,
    latencies: list[float],
) -> int:
    """Unary calls back to back from ``concurrency`` tasks until ``deadline``; the errors."""
    call = channel.unary_unary(method)  # bytes in, bytes out: no (de)serialization
    errors = 0

    async def user() -> None:
        nonlocal errors
        while (began := time.perf_counter()) < deadline:
            try:
                await call(body, timeout=10)
            except grpc.aio.AioRpcError:
                errors += 1
            latencies.append(time.perf_counter() - began)

    await asyncio.gather(*(user() for _ in range(concurrency)))
    return errors


async def _stream(
    channel: grpc.aio.Channel,
    body: bytes,
    concurrency: int,
    deadline: float,
    latencies: list[float],
) -> int:
    """One ModelStreamInfer call with ``concurrency`` requests in flight until ``deadline``,
    each answer's latency from its request's write (answers come in the order sent); the
    answers that carry an error (field 1, ``error_message``, serialized first)."""
    call = channel.stream_stream(STREAM_METHOD)()
    sent: deque[float] = deque()
    errors = 0
    for _ in range(concurrency):
        sent.append(time.perf_counter())
        await call.write(body)
    while sent:
        answer = await call.read()
        if answer is grpc.aio.EOF:  # the call ended early: the rest are errors
            return errors + len(sent)
        latencies.append(time.perf_counter() - sent.popleft())
        errors += answer[:1] == b"\x0a"
        if time.perf_counter() < deadline:
            sent.append(time.perf_counter())
            await call.write(body)
    await call.done_writing()
    return errors


def run_grpc(
    address: str, method: str, body: bytes, concurrency: int, seconds: float, cpu: int | None
) -> dict[str, Any]:
    """One point, from a process of its own (pinned to ``cpu``, scheduled as ``run_wrk``'s),
    as ``run_wrk`` reports it."""
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "body"
        path.write_bytes(body)
        command = [sys.executable, "-m", "bench.grpc_load", address, method, str(path),
                   str(concurrency), str(seconds)]  # fmt: skip
        output = subprocess.run(
            client_command(command, cpu),
            capture_output=True,
            text=True,
            timeout=seconds + 60,
            check=True,
        ).stdout
    result: dict[str, Any] = json.loads(output)
    return result


def main() -> None:
    address, method, body_file, concurrency, seconds = sys.argv[1:6]
    body = Path(body_file).read_bytes()
    result = asyncio.run(drive(address, method, body, int(concurrency), float(seconds)))
    print(json.dumps(result))


if __name__ == "__main__":
    main()
