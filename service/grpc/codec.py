"""Protobuf <-> arrays for the gRPC face: ``ModelInferRequest`` to ``InferenceRequest`` and
``InferenceResult`` to ``ModelInferResponse``.

As the REST codecs (``service.codecs``, whose checks it shares), it checks only what the format
says (shapes, byte counts, typed contents of the declared datatype) and knows nothing of models.
Inputs come as ``raw_input_contents`` (little-endian bytes, one entry per input, as tritonclient
sends them) or as typed ``contents``; the response answers in kind: raw outputs to a raw request
(as Triton always answers), typed contents to a typed one.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from contract.model_config import V2_TO_NUMPY
from service import codecs
from service.errors import BadInputError
from service.grpc import inference_pb2 as pb
from service.inference import InferenceRequest, InferenceResult, RequestInput

# Which typed field of InferTensorContents holds each datatype (the protocol's table).
CONTENTS_FIELD = {
    "BOOL": "bool_contents",
    "INT8": "int_contents",
    "INT16": "int_contents",
    "INT32": "int_contents",
    "INT64": "int64_contents",
    "UINT8": "uint_contents",
    "UINT16": "uint_contents",
    "UINT32": "uint_contents",
    "UINT64": "uint64_contents",
    "FP32": "fp32_contents",
    "FP64": "fp64_contents",
    "BYTES": "bytes_contents",
}
# Each typed field's own element type (the protocol buffer's): values arrive within it, and
# narrow to the declared datatype through the codecs' range check, as JSON data does.
FIELD_DTYPES = {
    "bool_contents": np.dtype(np.bool_),
    "int_contents": np.dtype(np.int32),
    "int64_contents": np.dtype(np.int64),
    "uint_contents": np.dtype(np.uint32),
    "uint64_contents": np.dtype(np.uint64),
    "fp32_contents": np.dtype(np.float32),
    "fp64_contents": np.dtype(np.float64),
}


def parameter_values(parameters: Any) -> dict[str, Any]:
    """A protobuf map of ``InferParameter`` as plain Python values."""
    if not parameters:  # most requests have none; walking an empty map is not free
        return {}
    return {key: getattr(value, value.WhichOneof("parameter_choice") or "bool_param")
            for key, value in parameters.items()}  # fmt: skip


def decode_infer(request: pb.ModelInferRequest) -> tuple[InferenceRequest, bool]:
    """The request for the core, and whether the client sent its inputs raw."""
    raw = list(request.raw_input_contents)
    if raw and len(raw) != len(request.inputs):
        raise BadInputError(
            f"raw_input_contents holds {len(raw)} entries for {len(request.inputs)} inputs"
        )
    inputs = [_input(tensor, raw[i] if raw else None) for i, tensor in enumerate(request.inputs)]
    options = codecs.request_options(parameter_values(request.parameters))
    outputs = [
        codecs.requested_output(o.name, parameter_values(o.parameters)) for o in request.outputs
    ]
    decoded = InferenceRequest(
        inputs, outputs or None, options.binary_data_output, request.id or None,
        options.timeout_us, priority=options.priority,
    )  # fmt: skip
    return decoded, bool(raw)


def _input(tensor: Any, raw: bytes | None) -> RequestInput:
    what = f"input {tensor.name!r}"
    datatype = codecs.check_datatype(tensor.datatype, what)
    shape = codecs.check_shape(list(tensor.shape), what)
    codecs.check_tensor_parameters(parameter_values(tensor.parameters), what)
    if raw is not None:
        if tensor.HasField("contents"):  # two sets of values: which one was meant?
            raise BadInputError(f"{what}: contents must be empty when raw_input_contents is used")
        return RequestInput(codecs.raw_tensor(raw, shape, datatype, what), tensor.name, datatype)
    field = CONTENTS_FIELD.get(datatype)
    if field is None:
        raise BadInputError(f"{what}: {datatype} travels only in raw_input_contents")
    values = getattr(tensor.contents, field)
    count = math.prod(shape)
    if len(values) != count:
        raise BadInputError(
            f"{what}: contents hold {len(values)} values but shape {shape} needs {count}"
        )
    # Read as the field's own type: numpy refuses an int_contents value past INT8's range
    # with an OverflowError (a client's mistake answered INTERNAL), never a ServiceError.
    array = np.fromiter(values, dtype=FIELD_DTYPES[field], count=count)
    if array.dtype.kind == "f" and not codecs.all_finite(array):
        raise BadInputError(f"{what}: contents hold NaN or infinity")
    array = codecs.cast(array, V2_TO_NUMPY[datatype], what)
    return RequestInput(array.reshape(shape), tensor.name, datatype)


def encode_infer(result: InferenceResult, raw: bool) -> pb.ModelInferResponse:
    """The response: each output raw (``raw``) or as typed contents."""
    response = pb.ModelInferResponse(
        model_name=result.model.name, model_version=result.model.version, id=result.id or ""
    )
    for name, array, datatype in codecs.output_tensors(result):
        output = response.outputs.add(name=name, datatype=datatype, shape=array.shape)
        if raw:
            response.raw_output_contents.append(codecs.output_bytes(array))
        elif datatype == "BYTES":
            output.contents.bytes_contents.extend(v.encode() for v in array.reshape(-1).tolist())
        else:
            getattr(output.contents, CONTENTS_FIELD[datatype]).extend(array.reshape(-1).tolist())
    return response
