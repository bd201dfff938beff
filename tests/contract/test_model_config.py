"""Triton's config.pbtxt, written by export and read by the service."""

from __future__ import annotations

import pytest

from contract.model_config import ConfigParseError, ModelConfig, TensorConfig, load_model_config
from contract.names import PLATFORM


def test_config_pbtxt_round_trip() -> None:
    written = ModelConfig(
        name="m",
        platform=PLATFORM,
        max_batch_size=64,
        inputs=(TensorConfig("input", "FP32", (1, 8, 8)),),
        outputs=(TensorConfig("logits", "FP32", (10,)),),
        dynamic_batching=True,
        max_queue_delay_us=250,
    )
    config = load_model_config(written.to_pbtxt())
    assert config == written
    assert config.name == "m" and config.platform == "onnxruntime_onnx"
    assert config.max_batch_size == 64 and config.max_queue_delay_us == 250
    assert config.inputs == (TensorConfig("input", "FP32", (1, 8, 8)),)
    assert config.outputs == (TensorConfig("logits", "FP32", (10,)),)


def test_config_parser_handles_triton_syntax() -> None:
    text = """
    # a comment
    name: "x" platform: "onnxruntime_onnx"
    max_batch_size: 8
    input: [ { name: "a", data_type: TYPE_FP32, dims: [ 3 ] } ]
    input { name: "b" data_type: TYPE_INT64 dims: 2 dims: 2 }
    output [ { name: "y" data_type: TYPE_FP16 dims: [ -1 ] } ]
    instance_group [ { count: 2 kind: KIND_CPU } ]
    """
    config = load_model_config(text)
    assert [t.name for t in config.inputs] == ["a", "b"]
    assert config.inputs[1] == TensorConfig("b", "INT64", (2, 2))
    assert config.outputs[0].dims == (-1,) and not config.dynamic_batching
    for bad in ('name: "x', "input [ { name: 1 ", "{", 'name: "x" input { data_type: TYPE_X }'):
        with pytest.raises(ConfigParseError):
            load_model_config(bad)


def test_version_policy_and_instance_group() -> None:
    base = 'name: "m"\n'
    assert load_model_config(base).version_policy.select([1, 2, 3]) == [3]  # Triton's default
    policies = {
        "version_policy: { latest: { num_versions: 2 } }": [2, 3],
        "version_policy: { all: { } }": [1, 2, 3],
        "version_policy { specific { versions: [1, 3] } }": [1, 3],
    }
    for text, served in policies.items():
        config = load_model_config(base + text)
        assert config.version_policy.select([1, 2, 3]) == served
        assert load_model_config(config.to_pbtxt()).version_policy == config.version_policy
    groups = "instance_group [ { count: 2 kind: KIND_CPU }, { kind: KIND_CPU } ]"
    assert load_model_config(base + groups).instance_count == 3
    assert load_model_config(base).instance_count == 1
    for bad in ("version_policy: { newest: { } }", "instance_group [ { count: 0 } ]",
                "version_policy: { latest: { num_versions: 0 } }"):  # fmt: skip
        with pytest.raises(ConfigParseError):
            load_model_config(base + bad)
