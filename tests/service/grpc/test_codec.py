"""The gRPC face's codec: protobuf to arrays, with no model in sight."""

from __future__ import annotations

import numpy as np
import pytest

from contract.model_config import V2_TO_NUMPY
from service.errors import BadInputError
from service.grpc import inference_pb2 as pb
from service.grpc.codec import decode_infer

HUGE = 2**31 - 1


def _request(shape: list[int], raw: bool) -> pb.ModelInferRequest:
    request = pb.ModelInferRequest(model_name="m")
    request.inputs.add(name="x", datatype="FP32", shape=shape)
    if raw:
        request.raw_input_contents.append(b"")
    return request


@pytest.mark.parametrize("raw", [True, False], ids=["raw", "contents"])
@pytest.mark.parametrize(
    "shape", [[0, HUGE, HUGE, HUGE], [HUGE, 0, HUGE], [-1, 4], [2**40]], ids=str
)
def test_a_shape_no_array_may_have_is_invalid_argument(shape: list[int], raw: bool) -> None:
    """Issue 62, item 5 (vLLM CVE-2025-62164's declared-shape class): an empty tensor with huge
    dimensions, raw or as contents, is a client's mistake (INVALID_ARGUMENT), not numpy's
    ValueError."""
    with pytest.raises(BadInputError, match="shape"):
        decode_infer(_request(shape, raw))


@pytest.mark.parametrize("raw", [True, False], ids=["raw", "contents"])
def test_an_empty_tensor_within_the_bounds_decodes(raw: bool) -> None:
    request, _ = decode_infer(_request([0, 3], raw))
    (tensor,) = request.inputs
    assert tensor.array.shape == (0, 3) and tensor.array.dtype == np.float32


@pytest.mark.parametrize(
    ("datatype", "field", "value"),
    [("INT8", "int_contents", 128), ("INT8", "int_contents", -129),
     ("INT16", "int_contents", 2**15), ("UINT8", "uint_contents", 256)],
)  # fmt: skip
def test_typed_contents_past_the_datatype_are_invalid_argument(
    datatype: str, field: str, value: int
) -> None:
    """Triton CVE-2025-23323's class (integer wraparound): a value its wire field holds but
    the declared datatype does not is the client's mistake, as in V2 JSON's ``data``; numpy's
    OverflowError was answered INTERNAL."""
    request = pb.ModelInferRequest(model_name="m")
    getattr(request.inputs.add(name="x", datatype=datatype, shape=[2]).contents, field).extend(
        [0, value]
    )
    with pytest.raises(BadInputError, match=f"outside the {datatype.lower()} range"):
        decode_infer(request)


@pytest.mark.parametrize(
    ("datatype", "field", "values"),
    [("INT8", "int_contents", [-128, 127]), ("UINT8", "uint_contents", [0, 255]),
     ("BOOL", "bool_contents", [True, False]), ("FP64", "fp64_contents", [1e300, -2.5])],
)  # fmt: skip
def test_typed_contents_within_the_datatype_decode_as_it(
    datatype: str, field: str, values: list
) -> None:
    request = pb.ModelInferRequest(model_name="m")
    tensor = request.inputs.add(name="x", datatype=datatype, shape=[2])
    getattr(tensor.contents, field).extend(values)
    decoded, _ = decode_infer(request)
    (array,) = (t.array for t in decoded.inputs)
    assert array.dtype == V2_TO_NUMPY[datatype] and array.tolist() == values
