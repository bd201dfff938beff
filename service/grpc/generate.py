"""Regenerate ``inference_pb2.py``, ``.pyi`` and ``inference_pb2_grpc.py`` from
``inference.proto``: ``make protos`` (needs grpcio-tools, a dev dependency).

protoc's Python output registers its messages in protobuf's default descriptor pool, where
tritonclient's and kserve's own copies of the protocol register the same ``inference.*`` names:
a process importing both fails with "duplicate symbol". The generated module is therefore given
a private pool (``POOL``, by ``contract.triton.generate.private_modules``, as Triton's model
config is), which the server's reflection service also reads; nothing else in the generated
code changes. ``tests/service/grpc/test_generate.py`` checks that the shipped modules
are what this produces.
"""

from __future__ import annotations

import sys
from pathlib import Path

from contract.triton.generate import private_modules

HERE = Path(__file__).resolve().parent
PROTO = "service/grpc/inference.proto"


def generate() -> dict[str, str]:
    """The three generated modules' text, with the private pool."""
    return private_modules(PROTO, grpc=True)


def main() -> None:
    """Write the generated modules next to the .proto."""
    for name, text in generate().items():
        (HERE / name).write_text(text)
        print(f"wrote service/grpc/{name}", file=sys.stderr)


if __name__ == "__main__":
    main()
