"""The gRPC face's codec: protobuf to arrays, with no model in sight."""

from __future__ import annotations

import numpy as np
import pytest

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
