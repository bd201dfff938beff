"""``runs/ceiling-2026-11-28/where.py``'s ``count`` or ``profile`` of the service's gRPC target
driven as Triton's ModelStreamInfer: one call with CONCURRENCY requests in flight, the next
written as each answer is read (as ``bench.grpc_load`` drives it), not unary calls.

    python runs/grpc-face-2026-11-28/stream.py MODE REQUESTS CONCURRENCY OUT

run from a checkout's root, with model_repository/ beside it.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

sys.path.insert(0, os.getcwd())
sys.path.insert(0, os.path.join(os.getcwd(), "runs/ceiling-2026-11-28"))
import where

STREAM = "/inference.GRPCInferenceService/ModelStreamInfer"


async def drive_stream(
    port: int, body: bytes, method: str, requests: int, concurrency: int
) -> None:
    """``requests`` requests on one ModelStreamInfer call, ``concurrency`` in flight."""
    import grpc

    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
        call = channel.stream_stream(STREAM)()
        sent = done = 0
        for _ in range(min(concurrency, requests)):
            await call.write(body)
            sent += 1
        while done < sent:
            answer = await call.read()
            if answer[:1] == b"\x0a":  # field 1, error_message: a failed request
                raise RuntimeError(answer[:300])
            done += 1
            if sent < requests:
                await call.write(body)
                sent += 1
        await call.done_writing()


if __name__ == "__main__":
    where.drive_grpc = drive_stream
    mode, requests, concurrency, out = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
    where.run(mode, "grpc", requests, concurrency, Path(out))
