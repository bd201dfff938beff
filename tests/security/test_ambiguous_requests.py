"""Ambiguous requests against a real ``gelu-serve serve``: a field the service reads one value
of sent twice (HTTP headers, gRPC metadata), and a body framed by a Transfer-Encoding other
than ``chunked`` alone, written byte by byte where a client library would merge or refuse
them. Each is refused in the one error shape (gRPC: INVALID_ARGUMENT), counted, and the
server serves on. Each case names the advisory its class comes from; docs/security.md says
where each is decided."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import grpc
import numpy as np
import pytest

from service.grpc import inference_pb2 as pb
from tests.servers import ServedFaces, answers, grpc_server, request_counts

pytestmark = pytest.mark.slow  # a real server process

KEY = "inference-key-0123456789"
TOKEN = "control-token-0123456789"
V2 = json.dumps(
    {"inputs": [{"name": "input", "shape": [1, 64], "datatype": "FP32", "data": [0.0] * 64}]}
).encode()
V1 = json.dumps({"instances": [[0.0] * 64]}).encode()
# Each restricted route, REST V1 and V2, with the header its credential travels in.
CREDENTIALS = {
    "V2 infer": ("/v2/models/digits-mlp/infer", V2, "x-api-key", KEY),
    "V1 predict": ("/v1/models/digits-mlp:predict", V1, "x-api-key", KEY),
    "V2 repository index": ("/v2/repository/index", b"{}", "authorization", f"Bearer {TOKEN}"),
}
# Two field lines of one credential: (first, second), with the right key as {key}.
REPEATS = {
    "wrong, then right": ("{name}: wrong", "{name}: {key}"),
    "right, then wrong": ("{name}: {key}", "{name}: wrong"),
    "right twice": ("{name}: {key}", "{name}: {key}"),
    "empty, then right": ("{name}:", "{name}: {key}"),
    "names in two cases": ("{upper}: wrong", "{name}: {key}"),
    "whitespace around values": ("{name}:\twrong\t", "{name}:   {key}"),
}
# What a request smuggled behind a refused one would be answered with, were it read.
SMUGGLED = b"POST /v2/repository/index HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n"


@pytest.fixture(scope="module")
def faces(model_repository: Path) -> Iterator[ServedFaces]:
    """Inference behind ``x-api-key``, the control routes behind a bearer token."""
    with grpc_server(
        model_repository,
        GELU_RESTRICTED_API=f"inference:x-api-key={KEY}",
        GELU_CONTROL_TOKEN=TOKEN,
    ) as served:
        yield served


def _request(
    path: str, body: bytes, lines: list[str], chunked: str | None = None, media: str = "json"
) -> bytes:
    """A POST of ``body`` (``application/{media}``) with the field ``lines``, framed by
    Content-Length, or chunked under the Transfer-Encoding line ``chunked``."""
    framing = f"Content-Length: {len(body)}" if chunked is None else chunked
    head = "\r\n".join(["Host: x", f"Content-Type: application/{media}", framing, *lines])
    payload = body if chunked is None else b"%x\r\n%s\r\n0\r\n\r\n" % (len(body), body)
    return f"POST {path} HTTP/1.1\r\n{head}\r\n\r\n".encode() + payload


def _closing(data: bytes) -> bytes:
    return data.replace(b"\r\n\r\n", b"\r\nConnection: close\r\n\r\n", 1)


def _answer(port: int, data: bytes) -> tuple[int, bytes]:
    """The one answer to ``data`` (on a connection the server closes): status and body."""
    (status, body), *rest = answers(port, _closing(data))
    assert not rest, rest
    return status, body


def _error(answer: tuple[int, bytes]) -> str:
    """A 400's message, checked to be in the one error shape."""
    status, body = answer
    error = json.loads(body)
    assert (status, list(error)) == (400, ["error"]), answer
    return str(error["error"])


def _refusals(port: int) -> float:
    """Requests the server counted as client mistakes (400)."""
    return sum(n for (_, code), n in request_counts(port).items() if code == "400")


@pytest.mark.parametrize("repeat", REPEATS.values(), ids=REPEATS)
@pytest.mark.parametrize("route", CREDENTIALS.values(), ids=CREDENTIALS)
def test_a_repeated_credential_header_is_400(
    faces: ServedFaces, route: tuple[str, bytes, str, str], repeat: tuple[str, str]
) -> None:
    """Envoy CVE-2026-26308 (Istio CVE-2026-31838) and OAuth2-proxy CVE-2025-64484: a
    credentials header sent twice, which a proxy checks one value of and the server reads
    another of (the service read the last: a key a proxy never saw passed). Every repeat, in
    any order, case or whitespace, is 400 naming the header, counted; a comma-joined value is
    one value, and no key (401); the server serves on."""
    path, body, name, key = route
    port = faces.http_port
    lines = [line.format(name=name, upper=name.upper(), key=key) for line in repeat]
    before = _refusals(port)
    error = _error(_answer(port, _request(path, body, lines)))
    assert f"'{name}'" in error and key not in error
    assert _refusals(port) == before + 1
    for joined in (f"{key}, wrong", f"wrong, {key}"):
        assert _answer(port, _request(path, body, [f"{name}: {joined}"]))[0] == 401
    assert _answer(port, _request(path, body, [f"{name}: {key}"]))[0] == 200


def _binary_v2() -> tuple[bytes, str]:
    """A V2 binary request (its JSON header, then the tensor) and its header's length."""
    tensor = {"name": "input", "shape": [1, 64], "datatype": "FP32",
              "parameters": {"binary_data_size": 256}}  # fmt: skip
    header = json.dumps({"inputs": [tensor]}).encode()
    return header + np.zeros(64, np.float32).tobytes(), str(len(header))


def _fields() -> dict[str, tuple[str, bytes, list[str], str]]:
    """Each field the service reads one value of, sent twice: route, body, lines, media."""
    binary, length = _binary_v2()
    auth = f"x-api-key: {KEY}"
    trace = "traceparent: 00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
    infer, octet = "/v2/models/digits-mlp/infer", "octet-stream"
    return {
        "Host": (infer, V2, [auth, "Host: y"], "json"),
        "Content-Type": (infer, V2, [auth, "Content-Type: text/plain"], "json"),
        "Inference-Header-Content-Length": (
            infer, binary, [auth, *[f"Inference-Header-Content-Length: {length}"] * 2], octet
        ),
        "X-Request-ID": (infer, V2, [auth, "X-Request-ID: a", "x-request-id: b"], "json"),
        "traceparent": ("/v1/models/digits-mlp:predict", V1, [auth, trace, trace], "json"),
        "Content-Encoding": (infer, V2, [auth, *["Content-Encoding: identity"] * 2], "json"),
        "X-Shape": (
            "/v1/activations/gelu", np.zeros(4, np.float32).tobytes(),
            [auth, "X-Shape: 4", "X-Shape: 2,2"], octet,
        ),
    }  # fmt: skip


FIELDS = _fields()


@pytest.mark.parametrize("case", FIELDS.values(), ids=FIELDS)
def test_a_repeated_field_the_service_reads_is_400(
    faces: ServedFaces, case: tuple[str, bytes, list[str], str]
) -> None:
    """RFC 9112 3.2 (a server MUST answer 400 to a request with two Host lines) and the class
    above for every other field the service reads one value of: each reader of the service
    picked its own (the body limits the last Content-Type or Inference-Header-Content-Length,
    the activation route the first X-Shape, the request id the first). Each repeat is 400
    naming the field, counted; the server serves on."""
    path, body, lines, media = case
    port = faces.http_port
    assert _answer(port, _request(path, body, lines[:-1], media=media))[0] == 200
    before = _refusals(port)
    assert "more than once" in _error(_answer(port, _request(path, body, lines, media=media)))
    assert _refusals(port) == before + 1
    auth = f"x-api-key: {KEY}"
    assert _answer(port, _request("/v2/models/digits-mlp/infer", V2, [auth]))[0] == 200


# Transfer-Encoding lines that httptools reads as a chunked body, dropping what else they name,
# each refused with 400 (RFC 9112 6.1 suggests 501 for a coding the server does not implement;
# a client's mistake is a 4xx here), its error naming what is wrong.
CODINGS = {
    "gzip, chunked": ["Transfer-Encoding: gzip, chunked"],
    "deflate, chunked": ["Transfer-Encoding: deflate, chunked"],
    "identity, chunked": ["Transfer-Encoding: identity, chunked"],
    "gzip and chunked lines": ["Transfer-Encoding: gzip", "Transfer-Encoding: chunked"],
    "Chunked": ["Transfer-Encoding: Chunked"],
    "CHUNKED": ["Transfer-Encoding: CHUNKED"],
    "chunked and a space": ["Transfer-Encoding: chunked "],
    "an empty coding first": ["Transfer-Encoding: , chunked"],
}


@pytest.mark.parametrize("coding", CODINGS.values(), ids=CODINGS)
def test_a_transfer_coding_other_than_chunked_alone_is_refused(
    faces: ServedFaces, coding: list[str]
) -> None:
    """Gunicorn CVE-2024-1135 and CVE-2024-6827 (Transfer-Encoding read unlike the proxy's:
    requests smuggled past its restrictions) and h11 CVE-2025-43859 (GHSA-vqfr-h8mv-ghfj)'s
    smuggling class: a body whose Transfer-Encoding is anything but ``chunked`` alone, which
    this parser read as chunked and served (a proxy that applies the other codings, or does
    not know ``Chunked``, frames it otherwise). Each is refused in the one error shape and the
    connection closed, first on a connection or behind a kept-alive request: the request
    smuggled behind it is never answered."""
    port = faces.http_port
    auth = f"x-api-key: {KEY}"
    framing, *more = coding
    refused = _request("/v2/models/digits-mlp/infer", V2, [auth, *more], chunked=framing)
    for before in (b"", _request("/v2/models/digits-mlp/infer", V2, [auth])):
        got = answers(port, before + refused + SMUGGLED)
        assert [s for s, _ in got] == [200] * bool(before) + [400], got
        error = json.loads(got[-1][1])
        assert list(error) == ["error"] and "Transfer-Encoding" in error["error"], error
    assert _answer(port, _request("/v2/models/digits-mlp/infer", V2, [auth]))[0] == 200


def _infer_request() -> pb.ModelInferRequest:
    request = pb.ModelInferRequest(model_name="digits-mlp")
    request.inputs.add(name="input", datatype="FP32", shape=[1, 64])
    request.raw_input_contents.append(np.zeros(64, np.float32).tobytes())
    return request


# gRPC methods, each with the metadata key the service reads for it and that key's right value.
METHODS = {
    "ModelInfer": ("x-api-key", KEY),
    "ModelStreamInfer": ("x-api-key", KEY),
    "RepositoryIndex": ("authorization", f"Bearer {TOKEN}"),
    "ServerLive": ("x-request-id", "one-id"),
}


def _call(faces: ServedFaces, method: str, metadata: list[tuple[str, str]]) -> grpc.StatusCode:
    """``method``'s status, called with ``metadata``."""
    stub = faces.stub()
    try:
        if method == "ModelStreamInfer":
            replies = list(stub.ModelStreamInfer(iter([_infer_request()]), metadata=metadata))
            assert not replies[0].error_message, replies
        elif method == "ModelInfer":
            stub.ModelInfer(_infer_request(), metadata=metadata, timeout=10)
        elif method == "RepositoryIndex":
            stub.RepositoryIndex(pb.RepositoryIndexRequest(), metadata=metadata, timeout=10)
        else:
            stub.ServerLive(pb.ServerLiveRequest(), metadata=metadata, timeout=10)
    except grpc.RpcError as exc:
        if exc.code() == grpc.StatusCode.INVALID_ARGUMENT:
            assert "more than once" in str(exc.details()), exc.details()
        return exc.code()
    return grpc.StatusCode.OK


@pytest.mark.parametrize("method", METHODS)
def test_a_repeated_metadata_key_is_invalid_argument(faces: ServedFaces, method: str) -> None:
    """The class above on gRPC: metadata is a multimap (grpc/grpc#1160), gRPC-Java's
    ``Metadata.get`` reads the last value, grpc-go's interceptors commonly the first, and
    grpc-js refuses a repeated ``authorization`` rather than pick one (grpc/grpc-node#1275);
    the service read the last. A credentials key or ``x-request-id`` sent twice, in any order,
    is INVALID_ARGUMENT naming it (a stream too), counted as a 400; a comma-joined value is one
    value (UNAUTHENTICATED); the server serves on."""
    key, right = METHODS[method]
    endpoint = f"grpc:{method}"
    invalid = grpc.StatusCode.INVALID_ARGUMENT
    for pair in (("wrong", right), (right, "wrong"), (right, right)):
        before = request_counts(faces.http_port).get((endpoint, "400"), 0)
        assert _call(faces, method, [(key, value) for value in pair]) == invalid, pair
        assert request_counts(faces.http_port).get((endpoint, "400"), 0) == before + 1
    if key != "x-request-id":
        joined = _call(faces, method, [(key, f"{right},wrong")])
        assert joined == grpc.StatusCode.UNAUTHENTICATED
    assert _call(faces, method, [(key, right)]) == grpc.StatusCode.OK
