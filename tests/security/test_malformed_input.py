"""Malformed input on every face of one real ``gelu-serve serve`` (HTTP and gRPC on loopback):
structurally valid but hostile messages, generated (hypothesis, derandomized) and the defects
they found. Whatever a client sends, its mistake is a 4xx in the one error shape (gRPC: the
matching status, never INTERNAL or UNKNOWN), no traceback reaches the log (``running`` checks
at stop), and the service goes on serving. The classes come from Triton CVE-2025-23323/23324/
23326/23327 (integer overflow and wraparound in sizes and values) and vLLM CVE-2025-62164
(a crafted tensor that crashes the server); the schemathesis fuzz of the OpenAPI document is
``tests/service/rest/test_fuzz.py``."""

from __future__ import annotations

import json
import math
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from service.grpc import inference_pb2 as pb
from service.grpc import inference_pb2_grpc as pb_grpc
from service.grpc.codec import CONTENTS_FIELD
from tests.servers import ServedFaces, grpc_server, post

pytestmark = pytest.mark.slow  # a real server and some hundreds of requests

TOKEN = "battery-control-token-0123456789"
AUTH = (("authorization", f"Bearer {TOKEN}"),)
HEADERS = {"Authorization": f"Bearer {TOKEN}"}
# What a client's mistake may be answered with; INTERNAL, UNKNOWN and UNAVAILABLE may not.
CLIENT_CODES = {
    grpc.StatusCode.INVALID_ARGUMENT,
    grpc.StatusCode.NOT_FOUND,
    grpc.StatusCode.RESOURCE_EXHAUSTED,
    grpc.StatusCode.UNAUTHENTICATED,
    grpc.StatusCode.PERMISSION_DENIED,
}
FUZZ = settings(
    max_examples=150,
    deadline=None,
    derandomize=True,  # the same cases every run: a failure reproduces
    suppress_health_check=list(HealthCheck),
    database=None,
)
MODEL = "digits-mlp"  # input "input" FP32 [-1, 64]
ROW = np.zeros((1, 64), np.float32)


@pytest.fixture(scope="module")
def faces(model_repository: Path) -> Iterator[ServedFaces]:
    env = {"GELU_CONTROL_TOKEN": TOKEN, "GELU_MODEL_CONTROL_MODE": "explicit",
           "GELU_LOAD_MODELS": "*"}  # fmt: skip
    with grpc_server(model_repository, **env) as served:
        yield served
        _assert_serving(served)


@pytest.fixture(scope="module")
def stub(faces: ServedFaces) -> Iterator[pb_grpc.GRPCInferenceServiceStub]:
    channel = grpc.insecure_channel(faces.address)
    yield pb_grpc.GRPCInferenceServiceStub(channel)
    channel.close()


def _assert_serving(faces: ServedFaces) -> None:
    """Both faces still answer a good request."""
    good = {"inputs": [{"name": "input", "datatype": "FP32", "shape": [1, 64],
                        "data": ROW.ravel().tolist()}]}  # fmt: skip
    status, _ = post(faces.http_port, f"/v2/models/{MODEL}/infer", json.dumps(good).encode())
    assert status == 200
    with grpc.insecure_channel(faces.address) as channel:
        answer = pb_grpc.GRPCInferenceServiceStub(channel).ModelInfer(_good_infer(), timeout=10)
    assert answer.outputs


def _good_infer() -> pb.ModelInferRequest:
    request = pb.ModelInferRequest(model_name=MODEL, raw_input_contents=[ROW.tobytes()])
    request.inputs.add(name="input", datatype="FP32", shape=[1, 64])
    return request


def _client_mistake_or_ok(call: Any, request: Any, what: object) -> grpc.StatusCode:
    """The call's status, which must be OK or a client's mistake with a message."""
    try:
        call(request, timeout=10, metadata=AUTH)
    except grpc.RpcError as exc:
        assert exc.code() in CLIENT_CODES, (what, exc.code(), exc.details())
        assert exc.details(), what
        return exc.code()
    return grpc.StatusCode.OK


def _http_mistake_or_ok(
    port: int, path: str, body: bytes, headers: dict[str, str] | None = None
) -> tuple[int, bytes]:
    """A POST's status and body: below 500, and an error in the one shape."""
    status, answer = post(port, path, body, {**HEADERS, **(headers or {})})
    assert status < 500, (path, body[:200], answer)
    if status >= 400:
        assert list(json.loads(answer)) == ["error"], (path, body[:200], answer)
    return status, answer


# ---- gRPC ModelInfer, generated ---------------------------------------------------------------

DATATYPES = ["BOOL", "UINT8", "UINT16", "UINT32", "UINT64", "INT8", "INT16", "INT32", "INT64",
             "FP16", "FP32", "FP64", "BF16", "BYTES", "fp32", "", "FP32\x00", "é"]  # fmt: skip
INT64 = st.integers(-(2**63), 2**63 - 1)
DIMS = st.one_of(st.integers(-2, 70), st.sampled_from([2**31 - 1, 2**31, 2**62, 2**63 - 1]), INT64)
# Each side of every narrow integer type's range.
EDGES = [-(2**15) - 1, -(2**15), -129, -128, 127, 128, 255, 256, 2**15 - 1, 2**15, 2**16 - 1, 2**16]
FIELDS: dict[str, st.SearchStrategy[Any]] = {
    "bool_contents": st.booleans(),
    "int_contents": st.one_of(st.sampled_from(EDGES), st.integers(-(2**31), 2**31 - 1)),
    "int64_contents": INT64,
    "uint_contents": st.one_of(st.sampled_from(EDGES[4:]), st.integers(0, 2**32 - 1)),
    "uint64_contents": st.integers(0, 2**64 - 1),
    "fp32_contents": st.floats(width=32),
    "fp64_contents": st.floats(),
    "bytes_contents": st.binary(max_size=8),
}
PARAMETERS = st.one_of(
    st.builds(pb.InferParameter, bool_param=st.booleans()),
    st.builds(pb.InferParameter, int64_param=INT64),
    st.builds(pb.InferParameter, string_param=st.text(max_size=8)),
    st.builds(pb.InferParameter, double_param=st.floats()),
    st.builds(pb.InferParameter, uint64_param=st.integers(0, 2**64 - 1)),
    st.just(pb.InferParameter()),
)
REQUEST_KEYS = ["priority", "timeout", "sequence_id", "sequence_start", "sequence_end",
                "binary_data_output", "other", ""]  # fmt: skip
OUTPUT_KEYS = ["classification", "binary_data", "shared_memory_region", "other"]


@st.composite
def infer_requests(draw: st.DrawFn) -> pb.ModelInferRequest:
    """A ModelInferRequest for the classifier whose every part may be hostile: datatypes,
    shapes, raw entries that disagree with them, typed contents beside or instead of them,
    repeated names, parameters of every type, outputs the model lacks, versions."""
    request = pb.ModelInferRequest(
        model_name=draw(st.sampled_from([MODEL, MODEL, "nope", "", "../" + MODEL])),
        model_version=draw(st.sampled_from(["", "", "1", "2", "3", "-1", "x", "1" * 30, "\u0661"])),
        id=draw(st.text(max_size=8)),
    )
    for _ in range(draw(st.integers(0, 3))):
        name = draw(st.sampled_from(["input", "input", "nope", ""]))
        datatype = draw(st.sampled_from(DATATYPES))
        tensor = request.inputs.add(name=name, datatype=datatype)
        if draw(st.booleans()):  # well formed but for the values, so that they are read
            tensor.shape.extend(draw(st.lists(st.integers(1, 4), min_size=1, max_size=3)))
            own = CONTENTS_FIELD.get(datatype, "fp32_contents")
            count = math.prod(tensor.shape)
            values = st.lists(FIELDS[own], min_size=count, max_size=count)
            getattr(tensor.contents, own).extend(draw(values))
        else:
            tensor.shape.extend(draw(st.one_of(st.just([1, 64]), st.lists(DIMS, max_size=5))))
            for field in draw(st.lists(st.sampled_from(list(FIELDS)), max_size=2, unique=True)):
                getattr(tensor.contents, field).extend(draw(st.lists(FIELDS[field], max_size=70)))
        if draw(st.booleans()):
            tensor.parameters[draw(st.sampled_from(OUTPUT_KEYS))].CopyFrom(draw(PARAMETERS))
    raw = draw(st.sampled_from(["none", "none", "none", "matching", "fewer", "more", "odd"]))
    if raw != "none":
        count = len(request.inputs) + {"matching": 0, "fewer": -1, "more": 1, "odd": 0}[raw]
        size = st.sampled_from([256, 255, 3, 0, 512, 4, 8])
        request.raw_input_contents.extend(b"\x01" * draw(size) for _ in range(max(count, 0)))
    for key in draw(st.lists(st.sampled_from(REQUEST_KEYS), max_size=2, unique=True)):
        request.parameters[key].CopyFrom(draw(PARAMETERS))
    for _ in range(draw(st.integers(0, 2))):
        name = draw(st.sampled_from(["probabilities", "logits", "nope", ""]))
        output = request.outputs.add(name=name)
        if draw(st.booleans()):
            output.parameters[draw(st.sampled_from(OUTPUT_KEYS))].CopyFrom(draw(PARAMETERS))
    return request


def test_no_infer_request_gets_a_server_error(stub: pb_grpc.GRPCInferenceServiceStub) -> None:
    """Every generated ModelInferRequest is answered, or refused as the client's mistake."""
    codes: list[grpc.StatusCode] = []

    @FUZZ
    @given(request=infer_requests())
    def call(request: pb.ModelInferRequest) -> None:
        codes.append(_client_mistake_or_ok(stub.ModelInfer, request, request))

    call()
    assert len(codes) >= FUZZ.max_examples // 2 and grpc.StatusCode.INVALID_ARGUMENT in codes


@pytest.mark.parametrize(
    ("datatype", "field", "value"),
    [("INT8", "int_contents", 300), ("INT16", "int_contents", 70000),
     ("UINT8", "uint_contents", 256), ("INT8", "int_contents", -129)],
)  # fmt: skip
def test_typed_contents_past_their_datatype_are_invalid_argument_on_every_face(
    faces: ServedFaces, stub: pb_grpc.GRPCInferenceServiceStub, datatype: str, field: str,
    value: int,
) -> None:  # fmt: skip
    """Triton CVE-2025-23323's class (integer wraparound): a typed value the wire field holds
    and the declared datatype does not was numpy's OverflowError, answered INTERNAL with a
    traceback, on ModelInfer and each message of ModelStreamInfer; it is INVALID_ARGUMENT, as
    V2 JSON's 400 for the same value."""
    request = pb.ModelInferRequest(model_name=MODEL)
    tensor = request.inputs.add(name="input", datatype=datatype, shape=[1, 1])
    getattr(tensor.contents, field).append(value)
    with pytest.raises(grpc.RpcError) as refused:
        stub.ModelInfer(request, timeout=10)
    assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    range_error = f"outside the {datatype.lower()} range"
    assert range_error in (refused.value.details() or "")
    (streamed,) = stub.ModelStreamInfer(iter([request]), timeout=10)
    assert range_error in streamed.error_message
    body = {"inputs": [{"name": "input", "datatype": datatype, "shape": [1, 1], "data": [value]}]}
    status, answer = post(faces.http_port, f"/v2/models/{MODEL}/infer", json.dumps(body).encode())
    assert status == 400 and range_error in json.loads(answer)["error"]


def test_no_message_of_any_method_gets_a_server_error(
    faces: ServedFaces, stub: pb_grpc.GRPCInferenceServiceStub
) -> None:
    """Hostile names and versions on every model method and model control, and random bytes
    as the message (protobuf's decode failure) of every unary method."""
    names = ["nope", "", "..", "../digits-mlp", "digits-mlp/1", "\x00", "é" * 300, "*", MODEL]
    versions = ["", "1", "-1", "x", "1.0", " 1", "9" * 30, "\u0661", "1\x00"]
    calls = 0
    for name in names:
        for version in versions:
            for method, message in [
                ("ModelMetadata", pb.ModelMetadataRequest(name=name, version=version)),
                ("ModelReady", pb.ModelReadyRequest(name=name, version=version)),
                ("ModelConfig", pb.ModelConfigRequest(name=name, version=version)),
                ("ModelStatistics", pb.ModelStatisticsRequest(name=name, version=version)),
            ]:
                _client_mistake_or_ok(getattr(stub, method), message, (method, name, version))
                calls += 1
        if name != MODEL:  # unloading the classifier would leave the other cases nothing
            load = pb.RepositoryModelLoadRequest(model_name=name)
            _client_mistake_or_ok(stub.RepositoryModelLoad, load, name)
            unload = pb.RepositoryModelUnloadRequest(model_name=name)
            _client_mistake_or_ok(stub.RepositoryModelUnload, unload, name)
            calls += 2
    assert calls == len(names) * len(versions) * 4 + (len(names) - 1) * 2
    rng = np.random.default_rng(0)
    with grpc.insecure_channel(faces.address) as channel:
        for method in pb.DESCRIPTOR.services_by_name["GRPCInferenceService"].methods:
            if method.server_streaming or method.client_streaming:
                continue
            call = channel.unary_unary(f"/inference.GRPCInferenceService/{method.name}")
            for size in (1, 7, 64, 300):
                data = rng.integers(0, 256, size, dtype=np.uint8).tobytes()
                _client_mistake_or_ok(call, data, (method.name, data))


# ---- settings over both faces -----------------------------------------------------------------


def test_a_log_level_past_its_type_leaves_both_faces_answering(
    faces: ServedFaces, stub: pb_grpc.GRPCInferenceServiceStub
) -> None:
    """CWE-190 on Triton's logging extension: a ``log_verbose_level`` beyond uint32 (the type
    gRPC's LogSettings carries it in) was taken over HTTP, and every later LogSettings call on
    the gRPC face was INTERNAL; it is refused whole, 400, and both faces still answer."""
    status, answer = _http_mistake_or_ok(
        faces.http_port, "/v2/logging", json.dumps({"log_verbose_level": 2**32}).encode()
    )
    assert status == 400 and "log_verbose_level" in json.loads(answer)["error"]
    settings_now = stub.LogSettings(pb.LogSettingsRequest(), timeout=10, metadata=AUTH).settings
    assert settings_now["log_verbose_level"].uint32_param == 0


SETTING_VALUES = [True, False, 0, 1, -1, 2**32, 2**63, 1.5, 1e300, "", "x", "1", "9" * 5000,
                  None, [], [1], ["1"], ["OFF"], ["TIMESTAMPS", "OFF"], [[1]], {}, {"a": 1},
                  "OFF", "json"]  # fmt: skip


@pytest.mark.parametrize(
    "path", ["/v2/logging", "/v2/trace/setting", f"/v2/models/{MODEL}/trace/setting"]
)
def test_wrong_typed_settings_are_refused_and_change_nothing(
    faces: ServedFaces, stub: pb_grpc.GRPCInferenceServiceStub, path: str
) -> None:
    """Every setting of the logging and trace extensions with a value of every JSON type: a
    4xx in the one shape or a setting both faces then read back; ``trace_rate`` 1.5 and
    ``true`` were read as 1."""
    port = faces.http_port
    fields = json.loads(_get_authorized(port, path))
    for field in [*fields, "nope"]:
        for value in SETTING_VALUES:
            _http_mistake_or_ok(port, path, json.dumps({field: value}).encode())
    if "trace" in path:
        for value in (True, 1.5, 1e300):
            status, _ = _http_mistake_or_ok(port, path, json.dumps({"trace_rate": value}).encode())
            assert status == 400, value
    stub.LogSettings(pb.LogSettingsRequest(), timeout=10, metadata=AUTH)
    stub.TraceSetting(pb.TraceSettingRequest(model_name=MODEL), timeout=10, metadata=AUTH)
    reset = {"log_info": True, "log_warning": True, "log_error": True, "log_verbose_level": 0,
             "log_format": "default"}  # fmt: skip
    assert post(port, "/v2/logging", json.dumps(reset).encode(), HEADERS)[0] == 200


def _get_authorized(port: int, path: str) -> bytes:
    """A GET of a restricted route with the control token: its body."""
    import http.client

    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        connection.request("GET", path, headers=HEADERS)
        answer = connection.getresponse()
        assert answer.status == 200, path
        return answer.read()
    finally:
        connection.close()


# ---- HTTP: the binary extension, V1 and activations, generated ---------------------------------

SIZES = st.one_of(
    st.sampled_from([256, 255, 0, -1, 2**31, 2**63, 2**64, 10**30, "256", 256.0, True, None]),
    st.integers(-(2**70), 2**70),
)
JSON_VALUES = st.recursive(
    st.one_of(st.none(), st.booleans(), st.integers(-(2**70), 2**70),
              st.floats(allow_nan=False, allow_infinity=False), st.text(max_size=4)),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=3), inner,
                                                                max_size=3),
    max_leaves=12,
)  # fmt: skip


@st.composite
def binary_requests(draw: st.DrawFn) -> tuple[bytes, dict[str, str]]:
    """A V2 request in the binary extension whose declared sizes, header length and blobs may
    disagree with one another."""
    inputs = []
    for _ in range(draw(st.integers(0, 2))):
        inputs.append({
            "name": draw(st.sampled_from(["input", "nope"])),
            "datatype": draw(st.sampled_from(DATATYPES)),
            "shape": draw(st.one_of(st.just([1, 64]), st.lists(DIMS, max_size=3), JSON_VALUES)),
            "parameters": {"binary_data_size": draw(SIZES)},
        })  # fmt: skip
    header = json.dumps({"inputs": inputs}).encode()
    blobs = b"".join(b"\x00" * draw(st.sampled_from([256, 255, 0, 3])) for _ in range(2))
    length = draw(st.one_of(
        st.just(str(len(header))), st.integers(-5, len(header) + 600).map(str),
        st.sampled_from(["", "x", "+5", " 10", "1e3", "0x10", "9" * 30, "9" * 5000]),
    ))  # fmt: skip
    headers = {
        "Inference-Header-Content-Length": length,
        "Content-Type": "application/octet-stream",
    }
    return header + blobs, headers


def test_no_binary_extension_request_gets_a_server_error(faces: ServedFaces) -> None:
    statuses: list[int] = []

    @FUZZ
    @given(request=binary_requests())
    def call(request: tuple[bytes, dict[str, str]]) -> None:
        body, headers = request
        path = f"/v2/models/{MODEL}/infer"
        statuses.append(_http_mistake_or_ok(faces.http_port, path, body, headers)[0])

    call()
    assert 400 in statuses and len(statuses) >= FUZZ.max_examples // 2


QUERIES = ["", "?derivative=maybe", "?kernel=native", "?kernel=x", "?shape=-1", "?shape=0,4",
           "?shape=2x2", "?shape=1,,1", "?shape=%D9%A1", "?shape=" + "9" * 40,
           "?shape=2147483647,2147483647", "?derivative=1&shape=4"]  # fmt: skip


@st.composite
def json_bodies(draw: st.DrawFn) -> tuple[str, bytes, dict[str, str]]:
    """A V1 predict, a V2 JSON infer or an activation evaluation (JSON, raw float32 or hostile
    query parameters), with data of any JSON type and literals JSON lacks."""
    data = draw(st.one_of(
        st.lists(st.floats(allow_nan=False, allow_infinity=False, width=32), min_size=64,
                 max_size=64).map(lambda row: [row]),
        JSON_VALUES,
    ))  # fmt: skip
    kind = draw(st.sampled_from(["v1", "v1-inputs", "v2", "activation", "activation-raw"]))
    if kind.startswith("v1"):
        path = f"/v1/models/{draw(st.sampled_from([MODEL, 'digits-autoencoder', 'nope']))}:predict"
        body = json.dumps({"instances" if kind == "v1" else "inputs": data}).encode()
    elif kind == "v2":
        path = f"/v2/models/{MODEL}/infer"
        tensor = {"name": "input", "datatype": draw(st.sampled_from(DATATYPES)), "shape": [1, 64],
                  "data": data}  # fmt: skip
        body = json.dumps({"inputs": [tensor]}).encode()
    else:
        name = draw(st.sampled_from(["gelu", "gelu_tanh", "nope", "%00", "%D9%A1"]))
        query = draw(st.sampled_from(QUERIES))
        path = f"/v1/activations/{name}{query}"
        if kind == "activation-raw":
            raw = draw(st.binary(max_size=24))
            return path, raw, {"Content-Type": "application/octet-stream"}
        body = json.dumps({"data": data, draw(st.sampled_from(["derivative", "kernel", "x"])):
                           draw(JSON_VALUES)}).encode()  # fmt: skip
    literal = draw(st.sampled_from([None, b"NaN", b"Infinity", b"-Infinity", b"1e999", b"9" * 400]))
    if literal is not None and b"[" in body:  # a literal JSON has no number for, in the data
        at = body.index(b"[") + 1
        body = body[:at] + literal + (b"," if body[at : at + 1] != b"]" else b"") + body[at:]
    return path, body, {}


def test_no_json_request_gets_a_server_error(faces: ServedFaces) -> None:
    statuses: list[int] = []

    @FUZZ
    @given(request=json_bodies())
    def call(request: tuple[str, bytes, dict[str, str]]) -> None:
        path, body, headers = request
        statuses.append(_http_mistake_or_ok(faces.http_port, path, body, headers)[0])

    call()
    assert {200, 400} <= set(statuses) and len(statuses) >= FUZZ.max_examples // 2
