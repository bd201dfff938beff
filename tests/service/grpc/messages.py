"""ModelInfer requests for the gRPC face's tests: typed and raw contents, the bad ones with
the status and message each gets, and how a server's runs of them are counted."""

from __future__ import annotations

import threading
from collections.abc import Callable

import grpc
import numpy as np

from service.grpc import inference_pb2 as pb
from tests.helpers import DIGITS
from tests.servers import ServedFaces


def typed_request(x: np.ndarray, model: str = "digits-mlp") -> pb.ModelInferRequest:
    """``x`` as the ``input`` tensor's typed contents (``fp32_contents``)."""
    request = pb.ModelInferRequest(model_name=model)
    tensor = request.inputs.add(name="input", datatype="FP32", shape=x.shape)
    tensor.contents.fp32_contents.extend(x.ravel().tolist())
    return request


def raw_request(x: np.ndarray, model: str = "digits-mlp") -> pb.ModelInferRequest:
    """``x`` as the ``input`` tensor's raw bytes (``raw_input_contents``)."""
    request = pb.ModelInferRequest(model_name=model)
    request.inputs.add(name="input", datatype="FP32", shape=x.shape)
    request.raw_input_contents.append(x.astype("<f4").tobytes())
    return request


# Each bad request, the status it gets and what its message says.
BAD = [
    (lambda: pb.ModelInferRequest(model_name="nope"), grpc.StatusCode.NOT_FOUND, "unknown model"),
    (lambda: typed_request(DIGITS[:1, :10]), grpc.StatusCode.INVALID_ARGUMENT, "does not match"),
    (lambda: changed(typed_request(DIGITS[:2]), shape=[3, 64]), grpc.StatusCode.INVALID_ARGUMENT,
     "contents hold 128 values but shape [3, 64] needs 192"),
    (lambda: changed(raw_request(DIGITS[:2]), datatype="FP64"), grpc.StatusCode.INVALID_ARGUMENT,
     "bytes of data"),
    (lambda: changed(typed_request(DIGITS[:1]), datatype="BANANA"),
     grpc.StatusCode.INVALID_ARGUMENT, "datatype 'BANANA'"),
    (lambda: _raw_count(raw_request(DIGITS[:1])), grpc.StatusCode.INVALID_ARGUMENT,
     "raw_input_contents holds 2 entries for 1 inputs"),
    (lambda: _typed_too(raw_request(DIGITS[:1])), grpc.StatusCode.INVALID_ARGUMENT,
     "contents must be empty when raw_input_contents is used"),
    (lambda: _param(typed_request(DIGITS[:1]), "priority", -1), grpc.StatusCode.INVALID_ARGUMENT,
     "'priority' must be an integer"),
    (lambda: _param(typed_request(DIGITS[:1]), "timeout", -1), grpc.StatusCode.INVALID_ARGUMENT,
     "'timeout' must be an integer"),
    (lambda: typed_request(DIGITS[:300]), grpc.StatusCode.RESOURCE_EXHAUSTED,
     "above the maximum of 256"),
    (lambda: raw_request(np.zeros((8192, 64), np.float32)), grpc.StatusCode.RESOURCE_EXHAUSTED,
     "larger than max"),
    (lambda: changed(typed_request(DIGITS[:1]), shape=[1] * 40), grpc.StatusCode.INVALID_ARGUMENT,
     "at most 32"),
]  # fmt: skip


def changed(request: pb.ModelInferRequest, **changes) -> pb.ModelInferRequest:
    """``request`` with its first input's shape, datatype or name changed."""
    tensor = request.inputs[0]
    if "shape" in changes:
        del tensor.shape[:]
        tensor.shape.extend(changes["shape"])
    if "datatype" in changes:
        tensor.datatype = changes["datatype"]
    if "name" in changes:
        tensor.name = changes["name"]
    return request


def _raw_count(request: pb.ModelInferRequest) -> pb.ModelInferRequest:
    request.raw_input_contents.append(b"")
    return request


def _typed_too(request: pb.ModelInferRequest) -> pb.ModelInferRequest:
    request.inputs[0].contents.fp32_contents.extend(DIGITS[0].tolist())
    return request


def _param(request: pb.ModelInferRequest, key: str, value: int) -> pb.ModelInferRequest:
    request.parameters[key].int64_param = value
    return request


def runs_of_digits_mlp(
    server: ServedFaces, *calls: tuple[Callable[..., object], tuple]
) -> list[int]:
    """Makes the calls at once, each on its own thread; then the latest digits-mlp's inference
    and execution counts, and the size of each batch it has run, from ModelStatistics."""
    threads = [threading.Thread(target=call, args=args) for call, args in calls]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    stats = server.stub().ModelStatistics(pb.ModelStatisticsRequest(name="digits-mlp"))
    (latest,) = [s for s in stats.model_stats if s.version == "2"]
    sizes = sorted(b.batch_size for b in latest.batch_stats)
    return [latest.inference_count, latest.execution_count, *sizes]
