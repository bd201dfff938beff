"""Regenerate ``model_config_pb2.py`` and ``.pyi`` from Triton's ``model_config.proto``:
``make protos`` (needs grpcio-tools, a dev dependency).

The generated module is given a private descriptor pool (``POOL``; ``private_modules``, which
``service/grpc/generate.py`` uses too): Triton's messages are named ``inference.*``, as are
tritonclient's copy of them and the gRPC face's, and protobuf's default pool refuses a name
registered twice.
The module also carries NVIDIA's licence text (``LICENSE``), so that the notice travels with the
code wherever the package goes. Nothing else in protoc's output changes;
``tests/contract/triton/test_generate.py`` checks that the shipped modules are what this
produces.
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
PROTO = "contract/triton/model_config.proto"
OUTPUTS = ("model_config_pb2.py", "model_config_pb2.pyi")
DEFAULT_POOL = "DESCRIPTOR = _descriptor_pool.Default().AddSerializedFile("
PRIVATE_POOL = (
    "# gelu-serve: a private descriptor pool, so that these `inference.*` names never\n"
    "# collide with a client library's copy of them (contract/triton/generate.py).\n"
    "POOL = _descriptor_pool.DescriptorPool()\n"
    "DESCRIPTOR = POOL.AddSerializedFile("
)
STUB_DESCRIPTOR = "DESCRIPTOR: _descriptor.FileDescriptor\n"
STUB_POOL = (
    "DESCRIPTOR: _descriptor.FileDescriptor\n"
    "from google.protobuf import descriptor_pool as _descriptor_pool\n"
    "POOL: _descriptor_pool.DescriptorPool\n"
)


def _replace_once(text: str, old: str, new: str, what: str) -> str:
    if text.count(old) != 1:
        raise SystemExit(f"protoc's {what} changed shape: see contract/triton/generate.py")
    return text.replace(old, new)


def private_modules(proto: str, grpc: bool = False) -> dict[str, str]:
    """protoc's Python modules of ``proto`` (a path from the repository root), by file name:
    ``*_pb2.py`` with its messages in a private pool, its ``.pyi`` saying so, and with ``grpc``
    the ``*_pb2_grpc.py`` stubs."""
    from grpc_tools import protoc

    folder, stem = Path(proto).parent, Path(proto).stem
    with tempfile.TemporaryDirectory() as out:
        arguments = ["protoc", f"-I{ROOT}", f"--python_out={out}", f"--pyi_out={out}"]
        if grpc:
            arguments.append(f"--grpc_python_out={out}")
        if protoc.main([*arguments, str(ROOT / proto)]) != 0:
            raise SystemExit(f"protoc failed on {proto}")
        generated = {path.name: path.read_text() for path in (Path(out) / folder).iterdir()}
    module, stub = f"{stem}_pb2.py", f"{stem}_pb2.pyi"
    generated[module] = _replace_once(generated[module], DEFAULT_POOL, PRIVATE_POOL, "output")
    generated[stub] = _replace_once(generated[stub], STUB_DESCRIPTOR, STUB_POOL, "stub")
    return generated


def generate() -> dict[str, str]:
    """The generated modules' text, with the private pool and the licence."""
    generated = private_modules(PROTO)
    notice = "".join(
        f"# {line}".rstrip() + "\n" for line in (HERE / "LICENSE").read_text().splitlines()
    )
    coding, rest = generated[OUTPUTS[0]].split("\n", 1)  # the coding line stays first
    return {OUTPUTS[0]: f"{coding}\n{notice}{rest}", OUTPUTS[1]: generated[OUTPUTS[1]]}


def main() -> None:
    """Write the generated modules next to the .proto."""
    for name, text in generate().items():
        (HERE / name).write_text(text)
        print(f"wrote contract/triton/{name}", file=sys.stderr)


if __name__ == "__main__":
    main()
