"""Wire formats <-> numpy: the one place where request bytes become arrays and back.

V1 (KServe style) ``{"instances": [...]}``, the Open Inference Protocol's JSON and binary tensor
data extension, and the activation endpoint's JSON and raw float32 bodies. Every client mistake
raises a ``ServiceError`` subclass whose message says what was wrong.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np
import orjson

from service.errors import BadInputError, PayloadTooLargeError
from service.model_config import V2_TO_NUMPY, TensorConfig
from service.runtime import PROBABILITIES_OUTPUT, RECONSTRUCTION_OUTPUT, Model

HEADER_LENGTH = "Inference-Header-Content-Length"
SHAPE_HEADER = "X-Shape"
OCTET_STREAM = "application/octet-stream"
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


def json_array(data: Any, what: str, dtype: np.dtype) -> np.ndarray:
    """A (nested) list of numbers as an array of ``dtype``; refuses ragged, non-numeric or
    non-finite data instead of letting numpy coerce it."""
    try:
        array = np.asarray(data)
    except ValueError:
        raise BadInputError(f"{what}: nested lists of different lengths (ragged)") from None
    if array.dtype.kind not in "iuf" and not (array.dtype.kind == "b" and dtype.kind == "b"):
        raise BadInputError(
            f"{what}: expected numbers, found {_describe(array)}"
            if array.size
            else f"{what}: no values"
        )
    if dtype.kind == "f":
        with np.errstate(over="ignore"):
            array = array.astype(dtype, copy=False)
        if not np.isfinite(array).all():
            raise BadInputError(f"{what}: a value is outside the {dtype.name} range")
        return array
    info = np.iinfo(dtype) if dtype.kind in "iu" else None
    if info is not None and array.size and (array.min() < info.min or array.max() > info.max):
        raise BadInputError(f"{what}: a value is outside the {dtype.name} range")
    return array.astype(dtype, copy=False)


def _describe(array: np.ndarray) -> str:
    if array.dtype.kind in "US":
        return "strings"
    if array.dtype.kind == "b":
        return "booleans"
    return "null, objects or integers beyond 64 bits"


def check_shape(array: np.ndarray, tensor: TensorConfig, what: str) -> None:
    """``array`` must be [batch, *dims] of the model's input."""
    if array.ndim == 0 or array.shape[1:] != tensor.dims:
        got = list(array.shape[1:]) if array.ndim > 1 else "a scalar"
        raise BadInputError(f"{what}: each instance must have shape {list(tensor.dims)}, got {got}")


# ---- V1 -------------------------------------------------------------------------------------


def decode_v1(body: bytes, model: Model) -> dict[str, np.ndarray]:
    """``{"instances": [...]}`` (or KServe's ``{"inputs": [...]}``) -> the model's input."""
    payload = loads(body)
    if not isinstance(payload, dict):
        raise BadInputError('body must be a JSON object {"instances": [...]}')
    instances = payload.get("instances", payload.get("inputs"))
    if not isinstance(instances, list):
        raise BadInputError('body must be a JSON object {"instances": [...]} holding a list')
    if not instances:
        raise BadInputError("empty batch: send at least one instance")
    (tensor,) = model.inputs
    array = json_array(instances, "instances", tensor.numpy_dtype)
    check_shape(array, tensor, "instances")
    return {tensor.name: array}


def encode_v1(model: Model, outputs: dict[str, np.ndarray], inputs: dict[str, np.ndarray]) -> bytes:
    """A classifier's label, class index and probabilities; an autoencoder's reconstruction
    and its mean squared error; any other model's raw outputs."""
    if model.task == "classification" and PROBABILITIES_OUTPUT in outputs:
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
    elif model.task == "reconstruction" and RECONSTRUCTION_OUTPUT in outputs:
        reconstruction = outputs[RECONSTRUCTION_OUTPUT]
        (original,) = inputs.values()
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


@dataclass(frozen=True)
class V2Request:
    """A decoded inference request: inputs as arrays and how each output is wanted."""

    id: str | None
    inputs: dict[str, np.ndarray]
    outputs: list[tuple[str, bool]]  # (name, binary)


def _bool_parameter(entry: dict[str, Any], key: str, what: str) -> bool:
    parameters = entry.get("parameters") or {}
    if not isinstance(parameters, dict):
        raise BadInputError(f"{what}: parameters must be an object")
    value = parameters.get(key, False)
    if not isinstance(value, bool):
        raise BadInputError(f"{what}: parameter {key!r} must be true or false")
    return value


def _v2_input(
    entry: Any, model: Model, binary: memoryview, offset: int, max_batch: int
) -> tuple[str, np.ndarray, int]:
    if not isinstance(entry, dict):
        raise BadInputError("each of 'inputs' must be an object")
    name = entry.get("name")
    declared = {t.name: t for t in model.inputs}
    if name not in declared:
        raise BadInputError(
            f"unknown input {name!r} for model {model.name!r}; expected {sorted(declared)}"
        )
    tensor = declared[name]
    what = f"input {name!r}"
    datatype = entry.get("datatype")
    if datatype != tensor.datatype:
        raise BadInputError(
            f"{what}: datatype {datatype!r} does not match the model's {tensor.datatype}"
        )
    shape = entry.get("shape")
    if not (
        isinstance(shape, list)
        and all(isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in shape)
    ):
        raise BadInputError(f"{what}: shape must be a list of non-negative integers")
    if len(shape) != len(tensor.dims) + 1 or tuple(shape[1:]) != tensor.dims:
        raise BadInputError(
            f"{what}: shape {shape} does not match the model's [-1, "
            f"{', '.join(map(str, tensor.dims))}]"
        )
    if shape[0] == 0:
        raise BadInputError("empty batch: send at least one instance")
    if max_batch and shape[0] > max_batch:
        raise PayloadTooLargeError(f"batch of {shape[0]} is above the maximum of {max_batch}")
    count = math.prod(shape)
    dtype = tensor.numpy_dtype
    parameters = entry.get("parameters") or {}
    size = parameters.get("binary_data_size") if isinstance(parameters, dict) else None
    if size is not None:
        if not isinstance(size, int) or isinstance(size, bool) or size < 0:
            raise BadInputError(f"{what}: binary_data_size must be a non-negative integer")
        if size != count * dtype.itemsize:
            raise BadInputError(
                f"{what}: binary_data_size {size} does not match shape {shape} of "
                f"{tensor.datatype} ({count * dtype.itemsize} bytes)"
            )
        if offset + size > len(binary):
            raise BadInputError(
                f"{what}: binary data ends after {len(binary) - offset} of {size} bytes"
            )
        raw = binary[offset : offset + size]
        array = np.frombuffer(raw, dtype=dtype.newbyteorder("<")).astype(dtype, copy=False)
        if dtype.kind == "f" and not np.isfinite(array).all():
            raise BadInputError(f"{what}: binary data holds NaN or infinity")
        return name, array.reshape(shape), offset + size
    if "data" not in entry:
        raise BadInputError(f"{what}: needs 'data' or parameters.binary_data_size")
    array = json_array(entry["data"], what, dtype)
    if array.size != count:
        raise BadInputError(
            f"{what}: data holds {array.size} values but shape {shape} needs {count}"
        )
    return name, array.reshape(shape), offset


def decode_v2(body: bytes, header_length: str | None, model: Model, max_batch: int) -> V2Request:
    """Decode a JSON or binary-extension inference request for ``model``."""
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

    inputs: dict[str, np.ndarray] = {}
    offset = 0
    for entry in payload["inputs"]:
        name, array, offset = _v2_input(entry, model, binary, offset, max_batch)
        if name in inputs:
            raise BadInputError(f"input {name!r} appears twice")
        inputs[name] = array
    missing = [t.name for t in model.inputs if t.name not in inputs]
    if missing:
        raise BadInputError(f"missing input(s) {missing} for model {model.name!r}")
    if offset != len(binary):
        raise BadInputError(
            f"binary data holds {len(binary) - offset} bytes beyond the declared inputs"
        )
    if len({a.shape[0] for a in inputs.values()}) > 1:
        raise BadInputError("inputs have different batch sizes")

    binary_default = _bool_parameter(payload, "binary_data_output", "request")
    requested = payload.get("outputs")
    if requested is None:
        return V2Request(request_id, inputs, [(n, binary_default) for n in model.output_names])
    if not isinstance(requested, list) or not all(isinstance(o, dict) for o in requested):
        raise BadInputError("'outputs' must be a list of objects")
    outputs = []
    for entry in requested:
        name = entry.get("name")
        if name not in model.output_names:
            raise BadInputError(
                f"unknown output {name!r} for model {model.name!r}; expected {model.output_names}"
            )
        outputs.append((name, _bool_parameter(entry, "binary_data", f"output {name!r}")))
    return V2Request(
        request_id, inputs, outputs or [(n, binary_default) for n in model.output_names]
    )


def encode_v2(
    model: Model, request: V2Request, results: dict[str, np.ndarray]
) -> tuple[bytes, dict[str, str]]:
    """The response body and headers; binary outputs follow the JSON header."""
    datatypes = {t.name: t.datatype for t in model.config.outputs}
    outputs: list[dict[str, Any]] = []
    blobs: list[bytes] = []
    for name, binary in request.outputs:
        array = results[name]
        entry: dict[str, Any] = {"name": name, "datatype": datatypes[name], "shape": array.shape}
        if binary:
            blob = array.astype(array.dtype.newbyteorder("<"), copy=False).tobytes()
            entry["parameters"] = {"binary_data_size": len(blob)}
            blobs.append(blob)
        else:
            entry["data"] = array.reshape(-1)
        outputs.append(entry)
    response: dict[str, Any] = {"model_name": model.name, "model_version": model.version}
    if request.id is not None:
        response["id"] = request.id
    response["outputs"] = outputs
    header = dumps(response)
    if not blobs:
        return header, {"content-type": "application/json"}
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


def decode_activation_json(body: bytes, max_elements: int) -> tuple[np.ndarray, bool]:
    """``{"data": nested list, "derivative": bool}`` -> float32 array and the flag."""
    payload = loads(body)
    if not isinstance(payload, dict) or "data" not in payload:
        raise BadInputError('body must be a JSON object {"data": [...]}')
    derivative = payload.get("derivative", False)
    if not isinstance(derivative, bool):
        raise BadInputError("'derivative' must be true or false")
    array = json_array(payload["data"], "data", V2_TO_NUMPY["FP32"])
    check_elements(array.size, max_elements)
    return array, derivative


def decode_activation_binary(body: bytes, shape: str | None, max_elements: int) -> np.ndarray:
    """Raw little-endian float32 -> array of ``shape`` (default: one dimension)."""
    if len(body) % 4:
        raise BadInputError(f"binary body of {len(body)} bytes is not whole float32 values")
    count = len(body) // 4
    check_elements(count, max_elements)
    dims = parse_shape(shape, "shape") if shape else (count,)
    if math.prod(dims) != count:
        raise BadInputError(
            f"shape {list(dims)} needs {math.prod(dims)} values; body holds {count}"
        )
    return np.frombuffer(body, dtype="<f4").reshape(dims)


def check_elements(count: int, max_elements: int) -> None:
    """Refuse an activation array above the configured maximum."""
    if count > max_elements:
        raise PayloadTooLargeError(
            f"array of {count} values is above the maximum of {max_elements} "
            "(GELU_MAX_ACTIVATION_ELEMENTS)"
        )
