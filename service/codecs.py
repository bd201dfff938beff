"""Wire formats <-> arrays: the one place where request bytes become numpy and back.

V1 (KServe style) ``{"instances": [...]}``, the Open Inference Protocol's JSON and binary tensor
data extension, and the activation endpoint's JSON and raw float32 bodies. A codec checks only
what the format itself says (JSON syntax, numbers, declared shapes and byte counts) and knows
nothing of models: names, datatypes, shapes and limits are checked against the model by the
core (``service.dataplane``). Every client mistake raises a ``ServiceError`` subclass whose
message says what was wrong.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import orjson

from contract.model_config import V2_TO_NUMPY
from contract.names import (
    CLASSIFICATION,
    PROBABILITIES_OUTPUT,
    RECONSTRUCTION,
    RECONSTRUCTION_OUTPUT,
)
from service.errors import BadInputError
from service.inference import InferenceRequest, InferenceResult, RequestInput, RequestOutput

HEADER_LENGTH = "Inference-Header-Content-Length"
SHAPE_HEADER = "X-Shape"
OCTET_STREAM = "application/octet-stream"
JSON = "application/json"
_DUMPS_OPTIONS = orjson.OPT_SERIALIZE_NUMPY


def _default(value: Any) -> Any:
    if isinstance(value, np.ndarray):  # what orjson's numpy support refuses: 0-d arrays
        return value.tolist()
    raise TypeError(f"cannot serialise {type(value).__name__}")


def dumps(payload: Any) -> bytes:
    """JSON bytes; numpy arrays serialise natively (orjson), without a Python list copy."""
    return orjson.dumps(payload, option=_DUMPS_OPTIONS, default=_default)


def loads(body: bytes) -> Any:
    """Parse JSON, answering malformed input (NaN, Infinity, 1e400 included) with a 400."""
    if not body:
        raise BadInputError("empty body: expected JSON")
    try:
        return orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        raise BadInputError(f"malformed JSON: {exc}") from None


def numbers(data: Any, what: str) -> np.ndarray:
    """A (nested) list of numbers (or booleans) as an array; refuses ragged or non-numeric
    data instead of letting numpy make objects or strings of it."""
    try:
        array = np.asarray(data)
    except ValueError:
        raise BadInputError(f"{what}: nested lists of different lengths (ragged)") from None
    if array.dtype.kind not in "iufb":
        raise BadInputError(f"{what}: expected numbers, found {_describe(array)}")
    return array


def cast(array: np.ndarray, dtype: np.dtype, what: str) -> np.ndarray:
    """``array`` as ``dtype``, refusing booleans for numbers and values outside its range."""
    if array.dtype.kind == "b" and dtype.kind != "b":
        raise BadInputError(f"{what}: expected numbers, found booleans")
    if dtype.kind == "f":
        with np.errstate(over="ignore"):
            converted = array.astype(dtype, copy=False)
        if not np.isfinite(converted).all():
            raise BadInputError(f"{what}: a value is outside the {dtype.name} range")
        return converted
    if dtype.kind in "iu" and array.size:
        info = np.iinfo(dtype)
        if array.min() < info.min or array.max() > info.max:
            raise BadInputError(f"{what}: a value is outside the {dtype.name} range")
    return array.astype(dtype, copy=False)


def _describe(array: np.ndarray) -> str:
    if array.dtype.kind in "US":
        return "strings"
    return "null, objects or integers beyond 64 bits"


# ---- V1 -------------------------------------------------------------------------------------


def decode_v1(body: bytes) -> InferenceRequest:
    """``{"instances": [...]}`` (or KServe's ``{"inputs": [...]}``): one row per instance."""
    payload = loads(body)
    if not isinstance(payload, dict):
        raise BadInputError('body must be a JSON object {"instances": [...]}')
    instances = payload.get("instances", payload.get("inputs"))
    if not isinstance(instances, list):
        raise BadInputError('body must be a JSON object {"instances": [...]} holding a list')
    return InferenceRequest([RequestInput(numbers(instances, "instances"))])


def encode_v1(result: InferenceResult) -> bytes:
    """A classifier's label, class index and probabilities; an autoencoder's reconstruction
    and its mean squared error; any other model's raw outputs."""
    model, outputs = result.model, result.outputs
    if model.task == CLASSIFICATION and PROBABILITIES_OUTPUT in outputs:
        probabilities = outputs[PROBABILITIES_OUTPUT]
        labels = model.label_names
        indices = probabilities.argmax(axis=1).tolist()
        predictions: list[Any] = [
            {
                "label": labels[i] if i < len(labels) else str(i),
                "class_index": i,
                "probabilities": row,
            }
            for i, row in zip(indices, probabilities, strict=True)
        ]
    elif model.task == RECONSTRUCTION and RECONSTRUCTION_OUTPUT in outputs:
        reconstruction = outputs[RECONSTRUCTION_OUTPUT]
        (original,) = result.inputs.values()
        errors = ((reconstruction - original) ** 2).reshape(len(original), -1).mean(axis=1)
        predictions = [
            {"reconstruction": row, "error": float(e)}
            for row, e in zip(reconstruction, errors, strict=True)
        ]
    else:
        predictions = [
            {name: array[i] for name, array in outputs.items()}
            for i in range(len(next(iter(outputs.values()))))
        ]
    return dumps({"predictions": predictions})


# ---- Open Inference Protocol (V2) -----------------------------------------------------------


def _bool_parameter(entry: dict[str, Any], key: str, what: str) -> bool:
    parameters = entry.get("parameters") or {}
    if not isinstance(parameters, dict):
        raise BadInputError(f"{what}: parameters must be an object")
    value = parameters.get(key, False)
    if not isinstance(value, bool):
        raise BadInputError(f"{what}: parameter {key!r} must be true or false")
    return value


def _v2_input(entry: Any, binary: memoryview, offset: int) -> tuple[RequestInput, int]:
    """One entry of ``inputs``, its data from JSON or from the binary section at ``offset``."""
    if not isinstance(entry, dict):
        raise BadInputError("each of 'inputs' must be an object")
    name = entry.get("name")
    if not isinstance(name, str):
        raise BadInputError("each of 'inputs' needs a 'name' string")
    what = f"input {name!r}"
    datatype = entry.get("datatype")
    if datatype not in V2_TO_NUMPY:
        raise BadInputError(f"{what}: datatype {datatype!r} is not one of {', '.join(V2_TO_NUMPY)}")
    shape = entry.get("shape")
    if not (
        isinstance(shape, list)
        and all(isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in shape)
    ):
        raise BadInputError(f"{what}: shape must be a list of non-negative integers")
    count = math.prod(shape)
    dtype = V2_TO_NUMPY[datatype]
    parameters = entry.get("parameters") or {}
    size = parameters.get("binary_data_size") if isinstance(parameters, dict) else None
    if size is not None:
        if not isinstance(size, int) or isinstance(size, bool) or size < 0:
            raise BadInputError(f"{what}: binary_data_size must be a non-negative integer")
        if size != count * dtype.itemsize:
            raise BadInputError(
                f"{what}: binary_data_size {size} does not match shape {shape} of "
                f"{datatype} ({count * dtype.itemsize} bytes)"
            )
        if offset + size > len(binary):
            raise BadInputError(
                f"{what}: binary data ends after {len(binary) - offset} of {size} bytes"
            )
        raw = binary[offset : offset + size]
        array = np.frombuffer(raw, dtype=dtype.newbyteorder("<")).astype(dtype, copy=False)
        if dtype.kind == "f" and not np.isfinite(array).all():
            raise BadInputError(f"{what}: binary data holds NaN or infinity")
        return RequestInput(array.reshape(shape), name, datatype), offset + size
    if "data" not in entry:
        raise BadInputError(f"{what}: needs 'data' or parameters.binary_data_size")
    array = cast(numbers(entry["data"], what), dtype, what)
    if array.size != count:
        raise BadInputError(
            f"{what}: data holds {array.size} values but shape {shape} needs {count}"
        )
    return RequestInput(array.reshape(shape), name, datatype), offset


def decode_v2(body: bytes, header_length: str | None) -> InferenceRequest:
    """Decode a JSON or binary-extension inference request."""
    if header_length is None:
        header, binary = body, memoryview(b"")
    else:
        try:
            length = int(header_length)
        except ValueError:
            raise BadInputError(
                f"{HEADER_LENGTH} must be an integer, got {header_length!r}"
            ) from None
        if not 0 < length <= len(body):
            raise BadInputError(f"{HEADER_LENGTH} {length} is outside the body's {len(body)} bytes")
        header, binary = body[:length], memoryview(body)[length:]
    payload = loads(header)
    if not isinstance(payload, dict) or not isinstance(payload.get("inputs"), list):
        raise BadInputError("body must be a JSON object with an 'inputs' list")
    request_id = payload.get("id")
    if request_id is not None and not isinstance(request_id, str):
        raise BadInputError("'id' must be a string")

    inputs: list[RequestInput] = []
    offset = 0
    for entry in payload["inputs"]:
        tensor, offset = _v2_input(entry, binary, offset)
        inputs.append(tensor)
    if offset != len(binary):
        raise BadInputError(
            f"binary data holds {len(binary) - offset} bytes beyond the declared inputs"
        )
    binary_default = _bool_parameter(payload, "binary_data_output", "request")
    requested = payload.get("outputs")
    if requested is None or requested == []:
        return InferenceRequest(inputs, None, binary_default, request_id)
    if not isinstance(requested, list) or not all(isinstance(o, dict) for o in requested):
        raise BadInputError("'outputs' must be a list of objects")
    outputs = []
    for entry in requested:
        name = entry.get("name")
        if not isinstance(name, str):
            raise BadInputError("each of 'outputs' needs a 'name' string")
        outputs.append(
            RequestOutput(name, _bool_parameter(entry, "binary_data", f"output {name!r}"))
        )
    return InferenceRequest(inputs, outputs, binary_default, request_id)


def encode_v2(result: InferenceResult) -> tuple[bytes, dict[str, str]]:
    """The response body and headers; binary outputs follow the JSON header."""
    datatypes = {t.name: t.datatype for t in result.model.outputs}
    outputs: list[dict[str, Any]] = []
    blobs: list[bytes] = []
    for name, array in result.outputs.items():
        entry: dict[str, Any] = {"name": name, "datatype": datatypes[name], "shape": array.shape}
        if result.binary.get(name):
            blob = array.astype(array.dtype.newbyteorder("<"), copy=False).tobytes()
            entry["parameters"] = {"binary_data_size": len(blob)}
            blobs.append(blob)
        else:
            entry["data"] = array.reshape(-1)
        outputs.append(entry)
    response: dict[str, Any] = {
        "model_name": result.model.name,
        "model_version": result.model.version,
    }
    if result.id is not None:
        response["id"] = result.id
    response["outputs"] = outputs
    header = dumps(response)
    if not blobs:
        return header, {"content-type": JSON}
    return b"".join([header, *blobs]), {
        HEADER_LENGTH: str(len(header)),
        "content-type": OCTET_STREAM,
    }


# ---- activations ----------------------------------------------------------------------------


def parse_shape(text: str, what: str) -> tuple[int, ...]:
    """``"2,3"`` or ``"2x3"`` -> (2, 3); ``""`` -> () is refused."""
    try:
        shape = tuple(int(p) for p in text.replace("x", ",").split(",") if p.strip())
    except ValueError:
        raise BadInputError(f"{what} must be comma-separated integers, got {text!r}") from None
    if not shape or any(d < 0 for d in shape):
        raise BadInputError(f"{what} must be non-negative integers, got {text!r}")
    return shape


def decode_activation_json(body: bytes) -> tuple[np.ndarray, bool]:
    """``{"data": nested list, "derivative": bool}`` -> float32 array and the flag."""
    payload = loads(body)
    if not isinstance(payload, dict) or "data" not in payload:
        raise BadInputError('body must be a JSON object {"data": [...]}')
    derivative = payload.get("derivative", False)
    if not isinstance(derivative, bool):
        raise BadInputError("'derivative' must be true or false")
    array = cast(numbers(payload["data"], "data"), V2_TO_NUMPY["FP32"], "data")
    return array, derivative


def decode_activation_binary(body: bytes, shape: str | None) -> np.ndarray:
    """Raw little-endian float32 -> array of ``shape`` (default: one dimension); no copy."""
    if len(body) % 4:
        raise BadInputError(f"binary body of {len(body)} bytes is not whole float32 values")
    count = len(body) // 4
    dims = parse_shape(shape, "shape") if shape else (count,)
    if math.prod(dims) != count:
        raise BadInputError(
            f"shape {list(dims)} needs {math.prod(dims)} values; body holds {count}"
        )
    return np.frombuffer(body, dtype="<f4").reshape(dims)


def encode_activation_json(name: str, derivative: bool, y: np.ndarray) -> bytes:
    """``{"name", "derivative", "shape", "data"}``, the data nested as the input was."""
    return dumps({"name": name, "derivative": derivative, "shape": y.shape, "data": y})


def encode_activation_binary(y: np.ndarray) -> tuple[memoryview, dict[str, str]]:
    """Raw little-endian float32, the shape in ``X-Shape``: the array's own memory, no copy."""
    headers = {SHAPE_HEADER: ",".join(map(str, y.shape)), "content-type": OCTET_STREAM}
    return np.ascontiguousarray(y, "<f4").data.cast("B"), headers
