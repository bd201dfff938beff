"""Wire formats to arrays and back, with no model in sight; and through the app, binary
payloads that do not fit what their JSON header declares."""

from __future__ import annotations

import json

import numpy as np
import pytest

from service import codecs
from service.errors import BadInputError
from service.grpc import codec as grpc_codec
from service.grpc import inference_pb2 as pb
from service.inference import InferenceResult, ModelInfo, TensorInfo
from tests.helpers import DIGITS, assert_error, binary_request, put_parameters

V2 = "/v2/models/digits-mlp/infer"


def test_v1_gives_one_unnamed_input_without_a_datatype() -> None:
    request = codecs.decode_v1(b'{"instances": [[1, 2], [3, 4]]}')
    (tensor,) = request.inputs
    assert tensor.name is None and tensor.datatype is None
    np.testing.assert_array_equal(tensor.array, [[1, 2], [3, 4]])
    assert request.outputs is None


def test_v2_decodes_the_declared_datatype_and_shape_json_and_binary() -> None:
    header = {
        "id": "7",
        "inputs": [
            {"name": "a", "shape": [2, 2], "datatype": "INT64", "data": [1, 2, 3, 4]},
            {"name": "b", "shape": [1, 3], "datatype": "FP32",
             "parameters": {"binary_data_size": 12}},
        ],
        "outputs": [{"name": "y", "parameters": {"binary_data": True}}],
    }  # fmt: skip
    text = json.dumps(header).encode()
    raw = np.array([0.5, 1.5, 2.5], "<f4").tobytes()
    request = codecs.decode_v2(text + raw, str(len(text)))
    a, b = request.inputs
    assert (a.name, a.datatype, a.array.dtype, a.array.shape) == ("a", "INT64", np.int64, (2, 2))
    np.testing.assert_array_equal(b.array, [[0.5, 1.5, 2.5]])
    assert [(o.name, o.binary) for o in request.outputs or []] == [("y", True)]
    assert request.id == "7"


@pytest.mark.parametrize(
    ("data", "dtype", "needle"),
    [
        ([1e39], np.float32, "outside the float32 range"),
        ([300], np.uint8, "outside the uint8 range"),
        ([True], np.float32, "found booleans"),
    ],
)
def test_cast_refuses_what_does_not_fit(data, dtype, needle: str) -> None:
    with pytest.raises(BadInputError, match=needle):
        codecs.cast(codecs.numbers(data, "x"), np.dtype(dtype), "x")


F32_MAX, F16_MAX = float(np.finfo(np.float32).max), float(np.finfo(np.float16).max)


@pytest.mark.parametrize(
    ("data", "dtype", "fits"),
    [
        ([F32_MAX, -F32_MAX], np.float32, True),  # squares above the quick bound: exact check
        ([1e38] * 1000, np.float32, True),
        ([0.5, -F32_MAX * 1.001], np.float32, False),
        ([F16_MAX, 1.0], np.float16, True),
        ([1.0, 70000.0], np.float16, False),
        ([1e300, -1e300], np.float64, True),
    ],
)
def test_cast_decides_the_float_range_exactly(data, dtype, fits: bool) -> None:
    array = codecs.numbers(data, "x")
    if fits:
        np.testing.assert_array_equal(codecs.cast(array, np.dtype(dtype), "x"), array.astype(dtype))
    else:
        with pytest.raises(BadInputError, match="outside the"):
            codecs.cast(array, np.dtype(dtype), "x")


@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.float64])
@pytest.mark.parametrize(
    ("values", "finite"),
    [
        ([0.5, -2.0], True),
        ([], True),
        (["max", "-max"], True),  # the sum of squares overflows: the exact check decides
        ([1.0, "nan"], False),
        (["max", "nan"], False),
        (["-inf", 0.0], False),
    ],
)
def test_raw_tensors_refuse_exactly_nan_and_infinity(dtype, values, finite: bool) -> None:
    maximum = float(np.finfo(dtype).max)
    named = {"max": maximum, "-max": -maximum, "nan": np.nan, "-inf": -np.inf}
    array = np.array([named.get(v, v) for v in values], dtype).reshape(1, -1)
    datatype = {np.float16: "FP16", np.float32: "FP32", np.float64: "FP64"}[dtype]
    raw = array.astype(np.dtype(dtype).newbyteorder("<")).tobytes()
    assert codecs.all_finite(array) is finite
    if finite:
        got = codecs.raw_tensor(raw, list(array.shape), datatype, "x")
        np.testing.assert_array_equal(got, array)
    else:
        with pytest.raises(BadInputError, match="NaN or infinity"):
            codecs.raw_tensor(raw, list(array.shape), datatype, "x")


def test_encode_v2_puts_binary_outputs_after_the_json() -> None:
    info = ModelInfo(
        name="m", version="1", versions=["1"], platform="onnxruntime_onnx", task="",
        arch="", activation="", label_names=(), inputs=[], outputs=[
            TensorInfo("y", "FP32", (2,)), TensorInfo("z", "FP32", (1,))
        ], input_normalisation={}, metrics={}, max_batch_size=8, providers=[],
        provider_options={}, instance_count=1, memory_bytes=0,
        dynamic_batching=False, max_queue_delay_us=None,
    )  # fmt: skip
    y = np.array([[1.0, 2.0]], np.float32)
    z = np.array([[3.0]], np.float32)
    body, headers = codecs.encode_v2(
        InferenceResult(info, {"y": y, "z": z}, binary={"y": True, "z": False}, id="9")
    )
    length = int(dict(headers)[b"inference-header-content-length"])
    response = json.loads(body[:length])
    assert response["id"] == "9" and response["model_version"] == "1"
    assert response["outputs"][0]["parameters"] == {"binary_data_size": 8}
    assert response["outputs"][1]["data"] == [3.0]
    np.testing.assert_array_equal(np.frombuffer(body[length:], "<f4"), [1.0, 2.0])
    assert dict(headers)[b"content-type"] == codecs.OCTET_STREAM.encode()


@pytest.mark.parametrize("dtype", ["<f4", ">f4", "=f4"])
def test_output_bytes_are_little_endian_whatever_the_arrays_order(dtype: str) -> None:
    values = np.array([[1.5, -2.25], [3.0, 0.125]], dtype)
    raw = codecs.output_bytes(values[:, ::-1])  # not contiguous either
    np.testing.assert_array_equal(np.frombuffer(raw, "<f4"), [-2.25, 1.5, 0.125, 3.0])


HUGE = codecs.MAX_DIM
# Declared shapes no array may have (issue 62, item 5; vLLM CVE-2025-62164's class): empty
# ones whose other dimensions multiply past numpy's sizes, products past int64 and past the
# element bound, dimensions negative or too large, and what the format refuses outright.
BAD_SHAPES = [
    ([0, HUGE, HUGE, HUGE], "more than"),
    ([0, HUGE, HUGE], "more than"),
    ([HUGE, 0, 2], "more than"),  # the 0 anywhere
    ([65536, 65536, 65536, 65536], "more than"),  # past int64, not only past the bound
    ([46341, 46341], "more than"),  # just past 2**31 - 1 elements
    ([-1, 3], "non-negative"),
    ([HUGE + 1], "non-negative"),
    ([1] * (codecs.MAX_DIMS + 1), "dimensions"),
]


@pytest.mark.parametrize(("shape", "needle"), BAD_SHAPES)
def test_a_shape_no_array_may_have_is_a_client_mistake(shape: list[int], needle: str) -> None:
    with pytest.raises(BadInputError, match=needle):
        codecs.check_shape(shape, "input 'x'")


def test_an_empty_shape_within_the_bound_is_an_empty_array() -> None:
    shape = [0, 46340, 46340]  # 2,147,395,600 elements, 0 counted as 1: within the bound
    assert codecs.check_shape(shape, "x") == shape
    assert codecs.raw_tensor(b"", shape, "FP32", "x").shape == tuple(shape)


@pytest.mark.parametrize(("shape", "needle"), BAD_SHAPES[:5])
def test_every_format_refuses_a_declared_shape_bomb(shape: list[int], needle: str) -> None:
    """V2 JSON, V2 binary and the activation route's X-Shape answer 400, never numpy's
    ValueError (a 500 and a traceback per request, issue 62, item 5)."""
    entry = {"name": "x", "datatype": "FP32", "shape": shape}
    with pytest.raises(BadInputError, match=needle):
        codecs.decode_v2(json.dumps({"inputs": [{**entry, "data": []}]}).encode(), None)
    binary = {**entry, "parameters": {"binary_data_size": 0}}
    header = json.dumps({"inputs": [binary]}).encode()
    with pytest.raises(BadInputError, match=needle):
        codecs.decode_v2(header, str(len(header)))
    with pytest.raises(BadInputError, match=needle):
        codecs.decode_activation_binary(b"", ",".join(map(str, shape)))


def _binary_case(x: np.ndarray, declared: int | None, extra: bytes = b"") -> tuple[bytes, dict]:
    content, headers = binary_request(x)
    if declared is not None:
        header = json.loads(content[: int(headers["Inference-Header-Content-Length"])])
        header["inputs"][0]["parameters"]["binary_data_size"] = declared
        text = json.dumps(header).encode()
        content = text + x.astype("<f4").tobytes()
        headers["Inference-Header-Content-Length"] = str(len(text))
    return content + extra, headers


@pytest.mark.parametrize(
    ("declared", "extra", "header_length", "needle"),
    [
        (100, b"", None, "binary_data_size 100 does not match shape [2, 64] of FP32 (512 bytes)"),
        (None, b"\x00" * 4, None, "4 bytes beyond the declared inputs"),
        (None, b"", "99999", "outside the body's"),
        (None, b"", "abc", "must be an integer"),
    ],
)
def test_binary_payload_that_does_not_match_its_shape(
    client, declared, extra, header_length, needle
) -> None:
    content, headers = _binary_case(DIGITS[:2], declared, extra)
    if header_length is not None:
        headers["Inference-Header-Content-Length"] = header_length
    assert_error(client.post(V2, content=content, headers=headers), 400, needle)


@pytest.mark.parametrize(
    ("header_length", "status", "needle"),
    [
        ("9" * 5000, 413, "JSON header of over 10**18 bytes is above the maximum"),
        ("-" + "9" * 5000, 400, "must be an integer, got '-999"),
    ],
)
def test_numbers_past_pythons_digit_limit_are_a_4xx(client, header_length, status, needle) -> None:
    """Over 4,300 digits, Python's int() raises: every such header is read without it."""
    content, headers = _binary_case(DIGITS[:2], None, b"")
    headers["Inference-Header-Content-Length"] = header_length
    assert_error(client.post(V2, content=content, headers=headers), status, needle)


def test_truncated_binary_payload(client) -> None:
    content, headers = binary_request(DIGITS[:2])
    assert_error(client.post(V2, content=content[:-8], headers=headers), 400, "binary data ends")


def test_non_finite_binary_input(client) -> None:
    x = DIGITS[:1].copy()
    x[0, 3] = np.nan
    content, headers = binary_request(x)
    assert_error(client.post(V2, content=content, headers=headers), 400, "NaN or infinity")


# Triton's shared-memory extension names a region per input or output (CVE-2024-0088 and
# CVE-2025-23319/23320/23334 lay in its offsets and sizes): this server has none.
SHARED_MEMORY = [
    {"shared_memory_region": "r", "shared_memory_byte_size": 256},
    {"shared_memory_region": "triton_python_backend_shm_region_1"},
    {"shared_memory_offset": 2**63, "shared_memory_byte_size": 2**64},
]


@pytest.mark.parametrize("parameters", SHARED_MEMORY)
def test_a_shared_memory_tensor_is_refused_by_every_codec(parameters: dict) -> None:
    """Ignored, an input naming a region with data in the body ran on that data, and an
    output asked for in a region was answered in the body: both are a 400 now, in V2 JSON,
    V2 binary and gRPC."""
    data = {"name": "x", "datatype": "FP32", "shape": [1, 2], "data": [0.0, 1.0]}
    for payload in (
        {"inputs": [{**data, "parameters": parameters}]},
        {"inputs": [data], "outputs": [{"name": "y", "parameters": parameters}]},
    ):
        with pytest.raises(BadInputError, match="has no shared memory"):
            codecs.decode_v2(json.dumps(payload).encode(), None)
    header = json.dumps({"inputs": [{**data, "parameters": {**parameters, "binary_data_size": 8}}]})
    with pytest.raises(BadInputError, match="has no shared memory"):
        codecs.decode_v2(header.encode() + bytes(8), str(len(header)))
    for where in ("input", "output"):
        request = pb.ModelInferRequest(model_name="m", raw_input_contents=[bytes(8)])
        tensor = request.inputs.add(name="x", datatype="FP32", shape=[1, 2])
        if where == "output":
            tensor = request.outputs.add(name="y")
        put_parameters(tensor.parameters, parameters, "uint64_param")
        with pytest.raises(BadInputError, match="has no shared memory"):
            grpc_codec.decode_infer(request)
    assert codecs.decode_v2(json.dumps({"inputs": [data]}).encode(), None).inputs  # without
