"""contract.triton.generate: the shipped ``model_config_pb2`` modules are what ``make protos``
makes of Triton's ``model_config.proto``."""

from __future__ import annotations

import pytest


def test_the_generated_modules_match_the_proto() -> None:
    pytest.importorskip("grpc_tools")
    from contract.triton.generate import HERE, generate

    for name, text in generate().items():
        assert (HERE / name).read_text() == text, f"{name} is stale: run `make protos`"
