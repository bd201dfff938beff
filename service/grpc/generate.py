"""Regenerate ``inference_pb2.py``, ``.pyi`` and ``inference_pb2_grpc.py`` from
``inference.proto``: ``make protos`` (needs grpcio-tools, a dev dependency).

protoc's Python output registers its messages in protobuf's default descriptor pool, where
tritonclient's and kserve's own copies of the protocol register the same ``inference.*`` names:
a process importing both fails with "duplicate symbol". The generated module is therefore given
a private pool (``POOL``), which the server's reflection service also reads; nothing else in the
generated code changes. ``tests/service/grpc/test_protocol.py`` checks that the shipped modules
are what this produces.
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
PROTO = "service/grpc/inference.proto"
DEFAULT_POOL = "DESCRIPTOR = _descriptor_pool.Default().AddSerializedFile("
PRIVATE_POOL = (
    "# gelu-serve: a private descriptor pool, so that these `inference.*` names never\n"
    "# collide with a client library's copy of the protocol (service/grpc/generate.py).\n"
    "POOL = _descriptor_pool.DescriptorPool()\n"
    "DESCRIPTOR = POOL.AddSerializedFile("
)
STUB_DESCRIPTOR = "DESCRIPTOR: _descriptor.FileDescriptor\n"
STUB_POOL = (
    "DESCRIPTOR: _descriptor.FileDescriptor\n"
    "from google.protobuf import descriptor_pool as _descriptor_pool\n"
    "POOL: _descriptor_pool.DescriptorPool\n"
)
OUTPUTS = ("inference_pb2.py", "inference_pb2.pyi", "inference_pb2_grpc.py")


def generate() -> dict[str, str]:
    """The three generated modules' text, with the private pool."""
    from grpc_tools import protoc

    with tempfile.TemporaryDirectory() as out:
        arguments = [
            "protoc",
            f"-I{ROOT}",
            f"--python_out={out}",
            f"--pyi_out={out}",
            f"--grpc_python_out={out}",
            str(ROOT / PROTO),
        ]
        if protoc.main(arguments) != 0:
            raise SystemExit(f"protoc failed on {PROTO}")
        generated = {name: (Path(out) / "service" / "grpc" / name).read_text() for name in OUTPUTS}
    source = generated["inference_pb2.py"]
    if DEFAULT_POOL not in source:
        raise SystemExit("protoc's output changed shape: see service/grpc/generate.py")
    generated["inference_pb2.py"] = source.replace(DEFAULT_POOL, PRIVATE_POOL)
    stub = generated["inference_pb2.pyi"]
    if STUB_DESCRIPTOR not in stub:
        raise SystemExit("protoc's stub changed shape: see service/grpc/generate.py")
    generated["inference_pb2.pyi"] = stub.replace(STUB_DESCRIPTOR, STUB_POOL)
    return generated


def main() -> None:
    """Write the generated modules next to the .proto."""
    for name, text in generate().items():
        (HERE / name).write_text(text)
        print(f"wrote service/grpc/{name}", file=sys.stderr)


if __name__ == "__main__":
    main()
