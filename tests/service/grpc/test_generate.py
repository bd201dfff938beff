"""The shipped gRPC modules are what ``make protos`` generates from ``inference.proto``, and
they stay out of the way of client libraries' copies of the protocol."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]


def test_the_generated_modules_match_the_proto() -> None:
    pytest.importorskip("grpc_tools")
    from service.grpc.generate import HERE, generate

    for name, text in generate().items():
        assert (HERE / name).read_text() == text, f"{name} is stale: run `make protos`"


def test_the_protocol_coexists_with_tritonclient_in_one_process() -> None:
    pytest.importorskip("tritonclient.grpc")  # a test extra: not on a bare GPU host
    script = (
        "import tritonclient.grpc.service_pb2 as theirs\n"
        "from service.grpc import inference_pb2 as ours\n"
        "assert ours.DESCRIPTOR.services_by_name['GRPCInferenceService'].full_name == "
        "theirs.DESCRIPTOR.services_by_name['GRPCInferenceService'].full_name\n"
        "request = theirs.ModelInferRequest(model_name='m', id='x')\n"
        "assert ours.ModelInferRequest.FromString(request.SerializeToString()).id == 'x'\n"
    )
    done = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
