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
import sys
from typing import Any, NamedTuple

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
HEADER_LENGTH_KEY = HEADER_LENGTH.lower().encode()  # as ASGI scopes and responses carry it
KERNEL_HEADER = "X-Kernel"
KERNEL_HEADER_KEY = KERNEL_HEADER.lower().encode()
SHAPE_HEADER = "X-Shape"
SHAPE_HEADER_KEY = SHAPE_HEADER.lower().encode()
OCTET_STREAM = "application/octet-stream"
JSON = "application/json"
# Response headers as the ASGI server takes them: lower-case names, bytes.
Headers = list[tuple[bytes, bytes]]
JSON_HEADERS: Headers = [(b"content-type", JSON.encode())]
BINARY_HEADERS: Headers = [(b"content-type", OCTET_STREAM.encode())]
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


def numbers(data: Any, what: str, booleans_possible: bool = True) -> np.ndarray:
    """A (nested) list of numbers, or of booleans, as an array; refuses ragged, non-numeric or
    mixed data instead of letting numpy make objects or strings of it, or 1 and 0 of ``true``
    and ``false``. ``booleans_possible`` False (the body has no ``true`` or ``false`` at all,
    see ``may_hold_booleans``) skips the scan for booleans among numbers."""
    try:
        array = np.asarray(data)
    except ValueError:
        raise BadInputError(f"{what}: nested lists of different lengths (ragged)") from None
    if array.dtype.kind not in "iufb":
        raise BadInputError(f"{what}: expected numbers, found {_describe(array)}")
    if booleans_possible and array.dtype.kind != "b" and _holds_boolean(data):
        raise BadInputError(f"{what}: expected numbers, found booleans among them")
    return array


def may_hold_booleans(body: bytes) -> bool:
    """False when a JSON body cannot hold a boolean: a scan of the bytes (C speed), so the
    element-by-element check runs only for bodies that say true or false somewhere."""
    return b"true" in body or b"false" in body


def _holds_boolean(data: Any) -> bool:
    """Whether a nested list numpy accepted as numbers has a boolean among them."""
    stack = [data]
    while stack:
        item = stack.pop()
        if type(item) is bool:
            return True
        if type(item) is list:
            if item and type(item[0]) is list:
                stack.extend(item)
            elif any(type(value) is bool for value in item):
                return True
    return False


LITTLE_ENDIAN_HOST = sys.byteorder == "little"  # native arrays are then the wire's byte order
FLOAT_MAX = {np.dtype(t): float(np.finfo(t).max) for t in (np.float16, np.float32, np.float64)}
# Every |x| is within its type's maximum when the sum of squares is within half its square: one
# BLAS call without a temporary (np.vdot), cheaper than the exact check's two numpy calls. The
# half is a margin far beyond the sum's rounding; above it, or NaN, the exact check decides.
SQUARES_WITHIN = {dtype: maximum * maximum / 2 for dtype, maximum in FLOAT_MAX.items()}


def all_finite(array: np.ndarray) -> bool:
    """Whether a float array holds no NaN or infinity. The sum of squares (``np.vdot``, one
    BLAS call, no temporary) is finite only if every value is; a sum that overflows, or a NaN,
    leaves the decision to the exact check (about 1 µs less for a 64-value row)."""
    return math.isfinite(np.vdot(array, array)) or bool(np.isfinite(array).all())


def cast(array: np.ndarray, dtype: np.dtype, what: str) -> np.ndarray:
    """``array`` as ``dtype``, refusing booleans for numbers and values outside its range."""
    if array.dtype.kind == "b" and dtype.kind != "b":
        raise BadInputError(f"{what}: expected numbers, found booleans")
    if dtype.kind == "f":
        if array.dtype.kind == "f" and array.size:
            # Checked before the cast, so that it never overflows (NaN fails too).
            if not (
                float(np.vdot(array, array)) <= SQUARES_WITHIN[dtype]
                or np.abs(array).max() <= FLOAT_MAX[dtype]
            ):
                raise BadInputError(f"{what}: a value is outside the {dtype.name} range")
            return array.astype(dtype, copy=False)
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
    array = numbers(instances, "instances", may_hold_booleans(body))
    return InferenceRequest([RequestInput(array)])


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


# Request parameters that would change what a request means, which this server cannot honour:
# refused rather than silently ignored (Triton's sequence batcher).
UNSUPPORTED_PARAMETERS = {
    "sequence_id": "stateful sequences",
    "sequence_start": "stateful sequences",
    "sequence_end": "stateful sequences",
}
# Tensor parameters of Triton's shared-memory extension (an input read from, an output written
# to, a region the client registered): this server has no shared memory, so a tensor naming a
# region is refused, not read from the body or answered in it (the extension's offsets and
# sizes are where Triton's CVE-2024-0088 and CVE-2025-23319/23320/23334 lay).
SHARED_MEMORY_PARAMETERS = (
    "shared_memory_region",
    "shared_memory_byte_size",
    "shared_memory_offset",
)
# The most dimensions, and the largest dimension, a request's tensor may declare; and the most
# elements its dimensions may multiply to, a 0 counted as 1 (``check_shape``).
MAX_DIMS = 32
MAX_DIM = 2**31 - 1
MAX_ELEMENTS = 2**31 - 1


def _parameters(entry: dict[str, Any], what: str) -> dict[str, Any]:
    parameters = entry.get("parameters")
    if parameters is None:
        return {}
    if not isinstance(parameters, dict):
        raise BadInputError(f"{what}: 'parameters' must be an object")
    return parameters


def check_tensor_parameters(parameters: dict[str, Any], what: str) -> dict[str, Any]:
    """An input's or output's ``parameters``, refusing the shared-memory extension's."""
    if parameters:
        for key in SHARED_MEMORY_PARAMETERS:
            if key in parameters:
                raise BadInputError(
                    f"{what}: parameter {key!r} is not supported: this server has no shared "
                    "memory; send the tensor's data in the request"
                )
    return parameters


def _bool_parameter(parameters: dict[str, Any], key: str, what: str) -> bool:
    value = parameters.get(key, False)
    if not isinstance(value, bool):
        raise BadInputError(f"{what}: parameter {key!r} must be true or false")
    return value


def _int_parameter(parameters: dict[str, Any], key: str, what: str, minimum: int) -> int | None:
    value = parameters.get(key)
    if value is not None and (
        not isinstance(value, int) or isinstance(value, bool) or value < minimum
    ):
        raise BadInputError(f"{what}: parameter {key!r} must be an integer of at least {minimum}")
    return value


def check_datatype(datatype: Any, what: str) -> str:
    """A declared datatype: one of the protocol's numeric names."""
    if not isinstance(datatype, str) or datatype not in V2_TO_NUMPY:
        raise BadInputError(f"{what}: datatype {datatype!r} is not one of {', '.join(V2_TO_NUMPY)}")
    return datatype


def check_shape(shape: Any, what: str) -> list[int]:
    """A declared shape: a list of at most MAX_DIMS integers in [0, MAX_DIM] whose product,
    a 0 counted as 1, is at most MAX_ELEMENTS.

    Every face's declared shapes pass here (V2 JSON and binary, gRPC, the activation route's
    ``X-Shape``) before an array is built: an empty tensor whose other dimensions multiply
    past what numpy (or onnxruntime's int64 sizes) can describe, ``[0, 2**31 - 1, 2**31 - 1,
    2**31 - 1]``, is a client's mistake, a 400, not numpy's ValueError (issue 62, item 5; the
    declared-shape class of vLLM CVE-2025-62164)."""
    if type(shape) is not list:
        raise BadInputError(f"{what}: shape must be a list of non-negative integers <= {MAX_DIM}")
    if len(shape) > MAX_DIMS:
        raise BadInputError(f"{what}: shape has {len(shape)} dimensions; at most {MAX_DIMS}")
    extent = 1
    for d in shape:  # a loop, not all() over a generator: this runs on every V2 request
        if type(d) is not int or not 0 <= d <= MAX_DIM:  # type(): a bool is not a dimension
            raise BadInputError(
                f"{what}: shape must be a list of non-negative integers <= {MAX_DIM}"
            )
        extent *= d or 1  # at most MAX_ELEMENTS * MAX_DIM: never a large integer
        if extent > MAX_ELEMENTS:
            raise BadInputError(
                f"{what}: shape {shape} describes more than {MAX_ELEMENTS} elements (its "
                "dimensions multiplied, a 0 counted as 1)"
            )
    return shape


def _v2_input(
    entry: Any, binary: memoryview, offset: int, booleans_possible: bool
) -> tuple[RequestInput, int]:
    """One entry of ``inputs``, its data from JSON or from the binary section at ``offset``."""
    if not isinstance(entry, dict):
        raise BadInputError("each of 'inputs' must be an object")
    name = entry.get("name")
    if not isinstance(name, str):
        raise BadInputError("each of 'inputs' needs a 'name' string")
    what = f"input {name!r}"
    datatype = check_datatype(entry.get("datatype"), what)
    shape = check_shape(entry.get("shape"), what)
    count = math.prod(shape)
    dtype = V2_TO_NUMPY[datatype]
    parameters = check_tensor_parameters(_parameters(entry, what), what)
    size = _int_parameter(parameters, "binary_data_size", what, 0)
    if size is not None:
        if size != count * dtype.itemsize:
            raise BadInputError(
                f"{what}: binary_data_size {size} does not match shape {shape} of "
                f"{datatype} ({count * dtype.itemsize} bytes)"
            )
        if offset + size > len(binary):
            raise BadInputError(
                f"{what}: binary data ends after {len(binary) - offset} of {size} bytes"
            )
        array = raw_tensor(binary[offset : offset + size], shape, datatype, what)
        return RequestInput(array, name, datatype), offset + size
    if "data" not in entry:
        raise BadInputError(f"{what}: needs 'data' or parameters.binary_data_size")
    array = cast(numbers(entry["data"], what, booleans_possible), dtype, what)
    if array.size != count:
        raise BadInputError(
            f"{what}: data holds {array.size} values but shape {shape} needs {count}"
        )
    return RequestInput(array.reshape(shape), name, datatype), offset


def raw_tensor(raw: bytes | memoryview, shape: list[int], datatype: str, what: str) -> np.ndarray:
    """A tensor from its raw little-endian bytes (V2's binary extension, gRPC's
    ``raw_input_contents``), refusing a wrong length and NaN or infinity."""
    dtype = V2_TO_NUMPY[datatype]
    expected = math.prod(shape) * dtype.itemsize
    if len(raw) != expected:
        raise BadInputError(
            f"{what}: {len(raw)} bytes of data for shape {shape} of {datatype} ({expected} bytes)"
        )
    array = np.frombuffer(raw, dtype=dtype.newbyteorder("<")).astype(dtype, copy=False)
    if dtype.kind == "f" and not all_finite(array):
        raise BadInputError(f"{what}: binary data holds NaN or infinity")
    return array.reshape(shape)


def output_bytes(array: np.ndarray) -> bytes:
    """An output's raw bytes: little-endian numbers, or BYTES' length-prefixed layout."""
    if array.dtype == object:
        return bytes_tensor(array)
    if not (LITTLE_ENDIAN_HOST and array.dtype.isnative):
        array = array.astype(array.dtype.newbyteorder("<"))
    return array.tobytes()


class RequestOptions(NamedTuple):
    """A V2 request's own parameters."""

    binary_data_output: bool = False
    timeout_us: int | None = None  # Triton's ``timeout``, in µs
    priority: int = 0  # Triton's ``priority``: 0 the model's default level, 1 the highest


NO_OPTIONS = RequestOptions()


def request_options(parameters: dict[str, Any]) -> RequestOptions:
    """A V2 request's own parameters: binary_data_output, and Triton's schedule policy
    (``timeout``, µs, and ``priority``); refuses those that would change its meaning and are
    not supported."""
    if not parameters:
        return NO_OPTIONS
    for key, feature in UNSUPPORTED_PARAMETERS.items():
        if key in parameters:
            raise BadInputError(
                f"request parameter {key!r} is not supported: this server has no {feature}"
            )
    return RequestOptions(
        _bool_parameter(parameters, "binary_data_output", "request"),
        _int_parameter(parameters, "timeout", "request", 0),
        _int_parameter(parameters, "priority", "request", 0) or 0,
    )


def requested_output(name: str, parameters: dict[str, Any]) -> RequestOutput:
    """One requested output and its parameters: binary_data, classification (Triton's)."""
    what = f"output {name!r}"
    check_tensor_parameters(parameters, what)
    classes = _int_parameter(parameters, "classification", what, 1) or 0
    return RequestOutput(name, _bool_parameter(parameters, "binary_data", what), classes)


def _v2_output(entry: Any) -> RequestOutput:
    if not isinstance(entry, dict) or not isinstance(entry.get("name"), str):
        raise BadInputError("each of 'outputs' must be an object with a 'name' string")
    name = entry["name"]
    return requested_output(name, _parameters(entry, f"output {name!r}"))


def decode_v2(body: bytes, header_length: str | None) -> InferenceRequest:
    """Decode a JSON or binary-extension inference request."""
    if header_length is None:
        header, binary = body, memoryview(b"")
    else:
        length = client_size(header_length.strip().encode("latin-1"))
        if length is None:
            shown = header_length if len(header_length) <= 40 else header_length[:37] + "..."
            raise BadInputError(f"{HEADER_LENGTH} must be an integer, got {shown!r}")
        if not 0 < length <= len(body):
            raise BadInputError(f"{HEADER_LENGTH} {length} is outside the body's {len(body)} bytes")
        header, binary = body[:length], memoryview(body)[length:]
    payload = loads(header)
    if not isinstance(payload, dict) or not isinstance(payload.get("inputs"), list):
        raise BadInputError("body must be a JSON object with an 'inputs' list")
    request_id = payload.get("id")
    if request_id is not None and not isinstance(request_id, str):
        raise BadInputError("'id' must be a string")
    options = request_options(_parameters(payload, "request"))

    inputs: list[RequestInput] = []
    offset = 0
    booleans_possible = may_hold_booleans(header)
    for entry in payload["inputs"]:
        tensor, offset = _v2_input(entry, binary, offset, booleans_possible)
        inputs.append(tensor)
    if offset != len(binary):
        raise BadInputError(
            f"binary data holds {len(binary) - offset} bytes beyond the declared inputs"
        )
    requested = payload.get("outputs")
    outputs = None
    if requested is not None and requested != []:
        if not isinstance(requested, list):
            raise BadInputError("'outputs' must be a list of objects")
        outputs = [_v2_output(entry) for entry in requested]
    return InferenceRequest(
        inputs, outputs, options.binary_data_output, request_id, options.timeout_us,
        priority=options.priority,
    )  # fmt: skip


def bytes_tensor(array: np.ndarray) -> bytes:
    """A BYTES tensor in the binary extension's layout: each element's length as a 4-byte
    little-endian integer, then its bytes, in row-major order."""
    parts = []
    for value in array.reshape(-1).tolist():
        data = value.encode() if isinstance(value, str) else bytes(value)
        parts += [len(data).to_bytes(4, "little"), data]
    return b"".join(parts)


def output_tensors(result: InferenceResult) -> list[tuple[str, np.ndarray, str]]:
    """Each output's name, array and V2 datatype: the model's, or BYTES for a
    classification's strings."""
    datatypes = {t.name: t.datatype for t in result.model.outputs}
    return [
        (name, array, "BYTES" if array.dtype == object else datatypes[name])
        for name, array in result.outputs.items()
    ]


def encode_v2(result: InferenceResult) -> tuple[bytes, Headers]:
    """The response body and headers; binary outputs follow the JSON header."""
    outputs: list[dict[str, Any]] = []
    blobs: list[bytes] = []
    for name, array, datatype in output_tensors(result):
        entry: dict[str, Any] = {"name": name, "datatype": datatype, "shape": array.shape}
        if result.as_binary(name):
            blob = output_bytes(array)
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
        return header, JSON_HEADERS
    return b"".join([header, *blobs]), [(HEADER_LENGTH_KEY, b"%d" % len(header)), *BINARY_HEADERS]


# ---- activations ----------------------------------------------------------------------------


def client_size(value: bytes) -> int | None:
    """A non-negative decimal a client sent (a header's bytes), or None if it is not one; one
    of more than 18 significant digits reads as 2**62, above every limit, without ``int()``
    (which refuses over 4,300 digits with a ValueError)."""
    if not value.isdigit():
        return None
    if len(value) <= 18:
        return int(value)
    value = value.lstrip(b"0") or b"0"
    return int(value) if len(value) <= 18 else 1 << 62


def parse_shape(text: str, what: str) -> tuple[int, ...]:
    """``"2,3"`` or ``"2x3"`` -> (2, 3), within the limits of ``check_shape``; an empty
    dimension (``"2,,3"``) is refused."""
    parts = [p.strip().lstrip("0") or "0" for p in text.replace("x", ",").split(",")]
    shown = text if len(text) <= 40 else text[:37] + "..."
    if not all(p.isascii() and p.isdigit() for p in parts):
        raise BadInputError(
            f"{what} must be comma-separated integers (non-negative), got {shown!r}"
        )
    if len(parts) > MAX_DIMS or any(len(p) > len(str(MAX_DIM)) for p in parts):
        # Before int(): Python refuses to convert over 4,300 digits, with a ValueError.
        raise BadInputError(
            f"{what} {shown!r}: at most {MAX_DIMS} dimensions, each at most {MAX_DIM}"
        )
    return tuple(check_shape([int(p) for p in parts], what))


def decode_activation_json(body: bytes) -> tuple[np.ndarray, bool, str | None]:
    """``{"data": nested list, "derivative": bool, "kernel": str}`` -> float32 array, the flag
    and the kernel asked for (None when the body names none)."""
    payload = loads(body)
    if not isinstance(payload, dict) or "data" not in payload:
        raise BadInputError('body must be a JSON object {"data": [...]}')
    derivative = payload.get("derivative", False)
    if not isinstance(derivative, bool):
        raise BadInputError("'derivative' must be true or false")
    kernel = payload.get("kernel")
    if kernel is not None and not isinstance(kernel, str):
        raise BadInputError("'kernel' must be a string")
    array = numbers(payload["data"], "data", may_hold_booleans(body))
    array = cast(array, V2_TO_NUMPY["FP32"], "data")
    return array, derivative, kernel


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


def encode_activation_json(name: str, derivative: bool, kernel: str, y: np.ndarray) -> bytes:
    """``{"name", "derivative", "kernel", "shape", "data"}``, the data nested as the input was."""
    return dumps(
        {"name": name, "derivative": derivative, "kernel": kernel, "shape": y.shape, "data": y}
    )


def encode_activation_binary(y: np.ndarray, kernel: str) -> tuple[memoryview, Headers]:
    """Raw little-endian float32, the shape in ``X-Shape`` and the kernel in ``X-Kernel``: the
    array's own memory, no copy."""
    headers = [
        (SHAPE_HEADER_KEY, ",".join(map(str, y.shape)).encode()),
        (KERNEL_HEADER_KEY, kernel.encode()),
        *BINARY_HEADERS,
    ]
    # Flat first: a memoryview of an array with a 0 in its shape cannot be cast (a 500 for
    # ``?shape=0,4``); reshaping a contiguous array is a view, not a copy.
    return np.ascontiguousarray(y, "<f4").reshape(-1).data.cast("B"), headers
