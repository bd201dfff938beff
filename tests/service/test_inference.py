"""What faces hand the core and get back: models described once, as Triton describes them."""

from __future__ import annotations

from service.inference import ModelInfo, TensorInfo, instance_group


def test_a_cuda_version_is_described_as_triton_would() -> None:
    info = ModelInfo(
        name="m", version="1", versions=["1"], platform="onnxruntime_onnx", task="",
        arch="", activation="", label_names=(), inputs=[], outputs=[],
        input_normalisation={}, metrics={}, max_batch_size=8,
        providers=["CUDAExecutionProvider", "CPUExecutionProvider"],
        provider_options={"CUDAExecutionProvider": {"device_id": "3", "use_tf32": "0"}},
        instance_count=2, memory_bytes=0, dynamic_batching=False, max_queue_delay_us=None,
    )  # fmt: skip
    cuda = info.provider_options["CUDAExecutionProvider"]
    assert instance_group(info, cuda) == {"kind": "KIND_GPU", "count": 2, "gpus": [3]}


def _described(config_max_batch_size: int) -> ModelInfo:
    """Version 2 of a model with one input ``x`` [3, 4] and one output ``y`` [2], on the CPU."""
    return ModelInfo(
        name="m", version="2", versions=["1", "2"], platform="onnxruntime_onnx", task="",
        arch="", activation="", label_names=(), inputs=[TensorInfo("x", "FP32", (3, 4))],
        outputs=[TensorInfo("y", "FP32", (2,))], input_normalisation={}, metrics={},
        max_batch_size=max(config_max_batch_size, 1), providers=["CPUExecutionProvider"],
        provider_options={"CPUExecutionProvider": {}}, instance_count=1, memory_bytes=0,
        dynamic_batching=False, max_queue_delay_us=None,
        config_max_batch_size=config_max_batch_size,
    )  # fmt: skip


def test_metadata_puts_the_batch_axis_first_only_where_the_model_batches() -> None:
    batched, fixed = _described(8).metadata(), _described(0).metadata()
    assert batched["inputs"] == [{"name": "x", "datatype": "FP32", "shape": [-1, 3, 4]}]
    assert batched["outputs"] == [{"name": "y", "datatype": "FP32", "shape": [-1, 2]}]
    assert fixed["inputs"][0]["shape"] == [3, 4] and fixed["outputs"][0]["shape"] == [2]
    assert batched["versions"] == ["1", "2"]
    assert _described(8).metadata(one_version=True)["versions"] == ["2"]


def test_the_configuration_is_tritons_model_configuration() -> None:
    config = _described(8).configuration()
    assert config["max_batch_size"] == 8 and config["platform"] == "onnxruntime_onnx"
    assert config["input"] == [{"name": "x", "data_type": "TYPE_FP32", "dims": (3, 4)}]
    assert config["output"] == [{"name": "y", "data_type": "TYPE_FP32", "dims": (2,)}]
    assert config["instance_group"] == [{"kind": "KIND_CPU", "count": 1}]
    assert "dynamic_batching" not in config and "optimization" not in config
