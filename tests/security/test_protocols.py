"""The wire protocols under attack, against a real ``gelu-serve serve``: HTTP/1.1 framing and
request targets (h11 and llhttp smuggling), the static assets' Range header (Starlette), form
bodies (Starlette, python-multipart), pickled bodies (BentoML), log injection (uvicorn), and
HTTP/2 and gRPC framing, metadata and compression (the rapid reset, CONTINUATION flood, grpcio
metadata and decompression classes), some written frame by frame where a client library
refuses to send them. Each case names the advisory its class comes from."""

from __future__ import annotations

import ast
import contextlib
import json
import os
import pickle
import socket
import struct
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from service.grpc import inference_pb2 as pb
from tests.servers import ROOT, ServedFaces, connect, get, grpc_server, read_all
from tests.servers import answers as _answers

pytestmark = pytest.mark.slow  # a real server process

INFER = "/v2/models/digits-mlp/infer"
BODY = json.dumps(
    {"inputs": [{"name": "input", "shape": [1, 64], "datatype": "FP32", "data": [0.0] * 64}]}
).encode()
# What a smuggled request would be answered with, were it parsed as a request of its own.
SMUGGLED = b"GET /v2/repository/index HTTP/1.1\r\nHost: x\r\n\r\n"


@pytest.fixture(scope="module")
def faces(model_repository: Path) -> Iterator[ServedFaces]:
    with grpc_server(model_repository, GELU_ACCESS_LOG="true") as served:
        yield served


def _head(target: str = INFER, headers: str = "", length: int | None = len(BODY)) -> bytes:
    framing = "" if length is None else f"Content-Length: {length}\r\n"
    return (
        f"POST {target} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        f"{framing}{headers}\r\n"
    ).encode()


def _chunked(body: bytes) -> bytes:
    return b"%x\r\n%s\r\n0\r\n\r\n" % (len(body), body)


def _refused(answers: list[tuple[int, bytes]], status: int = 400) -> str:
    """The one answer's error message: ``status`` in the one error shape, and nothing after it
    (no smuggled request answered: the server closed the connection)."""
    assert [s for s, _ in answers] == [status], answers
    body = json.loads(answers[0][1])
    assert list(body) == ["error"], body
    return str(body["error"])


# h11 CVE-2025-43859 (chunk data ended by any two bytes, not CRLF) and the framing class of
# request smuggling behind it (Transfer-Encoding against Content-Length, RFC 9112 6.3).
FRAMINGS = {
    "chunk ended by other bytes": _head(headers="Transfer-Encoding: chunked\r\n", length=None)
    + b"%x\r\n%sXX0\r\n\r\n" % (len(BODY), BODY)
    + SMUGGLED,
    "bare LF in a chunk extension": _head(headers="Transfer-Encoding: chunked\r\n", length=None)
    + b"%x;a\nb\r\n%s\r\n0\r\n\r\n" % (len(BODY), BODY)
    + SMUGGLED,
    "chunk size in hex with 0x": _head(headers="Transfer-Encoding: chunked\r\n", length=None)
    + b"0x%x\r\n%s\r\n0\r\n\r\n" % (len(BODY), BODY)
    + SMUGGLED,
    "Transfer-Encoding and Content-Length": _head(headers="Transfer-Encoding: chunked\r\n")
    + _chunked(BODY)
    + SMUGGLED,
    "chunked not the last coding": _head(
        headers="Transfer-Encoding: chunked, identity\r\n", length=None
    )
    + _chunked(BODY)
    + SMUGGLED,
    "two Content-Lengths": _head(headers=f"Content-Length: {len(BODY) + 10}\r\n") + BODY + SMUGGLED,
    "Content-Length with a sign": _head(headers=f"Content-Length: +{len(BODY)}\r\n", length=None)
    + BODY
    + SMUGGLED,
    "obs-fold": _head(headers="X-A: a\r\n Transfer-Encoding: chunked\r\n") + BODY + SMUGGLED,
    "space before the colon": _head(headers="Transfer-Encoding : chunked\r\n", length=None)
    + _chunked(BODY)
    + SMUGGLED,
    "bare LF line ends": _head().replace(b"\r\n", b"\n") + BODY + SMUGGLED,
}


@pytest.mark.parametrize("framing", FRAMINGS.values(), ids=FRAMINGS)
def test_an_ambiguous_framing_is_refused_and_nothing_after_it_is_served(
    faces: ServedFaces, framing: bytes
) -> None:
    """h11 CVE-2025-43859's class (request smuggling by framing the parser reads one way and a
    proxy another): each ambiguous framing is a 400 in the one error shape, the connection
    closed, so the request behind it is never answered; the same on a kept-alive connection."""
    assert "invalid HTTP request" in _refused(_answers(faces.http_port, framing))
    first = _head() + BODY
    answers = _answers(faces.http_port, first + framing)
    assert answers[0][0] == 200, answers
    _refused(answers[1:])
    assert get(faces.http_port, "/v2/health/ready")[0] == 200


# Request targets that uvicorn parses after the headers, where a failure raised from the
# parser's callback: no answer and an ERROR traceback per request (uvicorn issues 1262, 58).
TARGETS = ("127.0.0.1:22", "x", "http://[", "http://a", "http://a:99999999/v2", "http://a:b:c/")


@pytest.mark.parametrize("target", TARGETS)
def test_a_request_target_naming_no_path_is_400(faces: ServedFaces, target: str) -> None:
    """The authority-form of CONNECT (RFC 9112 3.2.3), absolute URLs whose host does not parse
    or that name no path: a 400 in the one error shape, first on a connection or after a
    kept-alive answer (the server's log is checked for tracebacks when it stops)."""
    for method in ("CONNECT", "GET", "POST"):
        data = f"{method} {target} HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n".encode()
        assert "invalid HTTP request" in _refused(_answers(faces.http_port, data))
        answers = _answers(faces.http_port, _head() + BODY + data)
        assert next(s for s, _ in answers) == 200
        _refused(answers[1:])
    assert get(faces.http_port, "/v2/health/ready")[0] == 200


RANGES = ("bytes=9-1", "bytes=99999999-", "items=0-1", "bytes=0-1", "bytes=" + "0-0," * 400 + "0-")


@pytest.mark.parametrize("given", RANGES)
def test_the_static_assets_ignore_range(faces: ServedFaces, given: str) -> None:
    """Starlette CVE-2025-62727 (a Range header of many ranges parsed in quadratic time by
    FileResponse) and its 400 and 416 answers outside the one error shape: the assets under
    /docs-assets are served whole whatever Range and If-Range say, and offer no ranges."""
    whole = _answers(faces.http_port, b"GET /docs-assets/swagger-ui.css HTTP/1.1\r\nHost: x\r\n"
                     b"Connection: close\r\n\r\n")  # fmt: skip
    asked = (
        f"GET /docs-assets/swagger-ui.css HTTP/1.1\r\nHost: x\r\nRange: {given}\r\n"
        "If-Range: x\r\nConnection: close\r\n\r\n"
    ).encode()
    with connect(faces.http_port) as sock:
        sock.sendall(asked)
        received = read_all(sock)
    head, _, body = received.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200 "), head
    assert b"accept-ranges" not in head.lower() and b"content-range" not in head.lower()
    assert body == whole[0][1] and len(body) > 100_000


FORMS = {
    # Starlette CVE-2023-30798 / CVE-2024-47874: a form of many fields, each buffered
    "multipart, many fields": (
        "multipart/form-data; boundary=b",
        b"".join(
            b'--b\r\nContent-Disposition: form-data; name="f%d"\r\n\r\n1\r\n' % i
            for i in range(5000)
        )
        + b"--b--\r\n",
    ),
    "urlencoded, many fields": ("application/x-www-form-urlencoded", b"a=1&" * 20000),
    # python-multipart CVE-2024-24762: a Content-Type whose options backtrack a regex
    "Content-Type that backtracks": ("multipart/form-data; a=" + '"' + "\\" * 8000, BODY),
    # python-multipart CVE-2024-53981: bytes before the first boundary, logged one by one
    "junk before the boundary": ("multipart/form-data; boundary=b", b"\r\n" * 50000 + b"--b--"),
}


@pytest.mark.parametrize("form", FORMS.values(), ids=FORMS)
@pytest.mark.parametrize("path", [INFER, "/v1/models/digits-mlp:predict", "/v1/activations/gelu"])
def test_form_bodies_are_never_parsed_as_forms(faces: ServedFaces, path: str, form: tuple) -> None:
    """Starlette CVE-2023-30798 and CVE-2024-47874, python-multipart CVE-2024-24762 and
    CVE-2024-53981: no route parses a form, so a multipart or urlencoded body is a body that is
    no JSON (400 in the one error shape), and a JSON body is read as JSON whatever options its
    Content-Type carries."""
    content_type, body = form
    status, answer = faces.http_post(path, body, {"Content-Type": content_type})
    if body is BODY and path == INFER:
        assert status == 200, answer
    else:
        assert status == 400 and list(json.loads(answer)) == ["error"], answer


class _Canary:
    """A pickle that makes a directory when it is loaded."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def __reduce__(self) -> tuple:
        return (os.mkdir, (str(self.path),))


@pytest.mark.parametrize(
    "content_type",
    ["application/octet-stream", "application/vnd.bentoml+pickle", "application/python-pickle"],
)
def test_a_pickled_body_is_never_loaded(
    faces: ServedFaces, tmp_path: Path, content_type: str
) -> None:
    """BentoML CVE-2025-27520 and CVE-2025-32375 (request bodies and runner payloads loaded
    with pickle): a pickle that would make a directory, sent to every data route as the body
    and as a binary tensor, is a 4xx and the directory never appears."""
    canary = tmp_path / "loaded"
    payload = pickle.dumps(_Canary(canary))
    tensor = {"name": "input", "shape": [1, len(payload)], "datatype": "BYTES",
              "parameters": {"binary_data_size": len(payload)}}  # fmt: skip
    header = json.dumps({"inputs": [tensor]})
    binary = {"Inference-Header-Content-Length": str(len(header)), "Content-Type": content_type}
    for path, body, headers in (
        (INFER, payload, {"Content-Type": content_type}),
        (INFER, header.encode() + payload, binary),
        ("/v1/models/digits-mlp:predict", payload, {"Content-Type": content_type}),
        ("/v1/activations/gelu", payload, {"Content-Type": content_type}),
    ):
        status, answer = faces.http_post(path, body, headers)
        assert status < 500, answer  # the activations take raw float32 bytes: maybe a 200
        assert status == 200 or list(json.loads(answer)) == ["error"], answer
    assert not canary.exists()


def test_the_service_imports_no_deserialiser_of_code() -> None:
    """BentoML CVE-2025-27520's structure: nothing in the service can turn bytes into objects
    that run code (pickle and its kin), so no route or loader can be made to."""
    unsafe = {"pickle", "cloudpickle", "dill", "marshal", "shelve", "joblib", "_pickle"}
    found = []
    for path in (ROOT / "service").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            names = (
                [a.name for a in node.names] if isinstance(node, ast.Import)
                else [node.module or ""] if isinstance(node, ast.ImportFrom) else []
            )  # fmt: skip
            found += [f"{path.name}: {n}" for n in names if n.split(".")[0] in unsafe]
    assert not found, found


def test_a_pipeline_flood_is_held_to_a_few_requests_per_connection(faces: ServedFaces) -> None:
    """Node.js CVE-2013-4450 (a client pipelines requests and never reads the answers: the
    server parsed and queued every one). uvicorn parsed each read of 64 KiB into a request
    object per request and read on after every answer: 40 connections of 4,000 pipelined
    GETs each grew the server by 289 MiB. Now a connection holds at most ``PIPELINE_DEPTH``
    requests behind the one being answered and reads no more while any wait; one more is
    refused with 429 in the one error shape once those are answered, and the connection
    closed."""
    from service.rest.protocol import PIPELINE_DEPTH

    live = b"GET /v2/health/live HTTP/1.1\r\nHost: x\r\n\r\n"
    answered = read_all_of(faces.http_port, live * (PIPELINE_DEPTH + 2))
    assert [a[:3] for a in answered] == [b"200"] * (PIPELINE_DEPTH + 1) + [b"429"]
    body = json.loads(answered[-1].partition(b"\r\n\r\n")[2])
    assert list(body) == ["error"] and "pipelined" in body["error"], body

    pid = faces.process.pid
    before = _vm(pid, "VmRSS:")
    held = []
    for _ in range(40):
        sock = connect(faces.http_port)
        sock.settimeout(2)
        with contextlib.suppress(OSError):  # the server stopped reading: the rest waits
            sock.sendall(live * 4000)
        held.append(sock)
    try:
        assert get(faces.http_port, "/v2/health/live", timeout=30)[0] == 200
        grown = _vm(pid, "VmRSS:") - before
    finally:
        for sock in held:
            sock.close()
    assert grown < 24 << 20, f"{grown >> 20} MiB for 40 pipelining connections"


def read_all_of(port: int, data: bytes) -> list[bytes]:
    """Each answer (status line on) to ``data`` sent in one write, until the server closes."""
    with connect(port) as sock:
        sock.sendall(data)
        return read_all(sock).split(b"HTTP/1.1 ")[1:]


def test_control_characters_never_forge_a_log_line(model_repository: Path) -> None:
    """uvicorn CVE-2020-7694 and CVE-2020-7695 (log and header injection through the request
    path): a path and a gRPC model name carrying CR, LF and terminal escapes become one access
    or error line each, the characters escaped."""
    forged = "%0d%0a2026-01-01%2000:00:00,000%20INFO%20gelu_serve:%20forged%1b[2J"
    with grpc_server(model_repository, GELU_ACCESS_LOG="true") as served:
        for path in (f"/v2/models/m{forged}/ready", f"/v2/models/m{forged}/infer"):
            with connect(served.http_port) as sock:
                sock.sendall(
                    f"GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n".encode()
                )
                assert read_all(sock).split(b" ")[1] in (b"400", b"404", b"405")
        with grpc.insecure_channel(served.address) as channel:
            ready = channel.unary_unary("/inference.GRPCInferenceService/ModelReady")
            name = "m\r\n2026-01-01 00:00:00,000 INFO gelu_serve: forged\x1b[2J"
            with pytest.raises(grpc.RpcError):
                ready(pb.ModelReadyRequest(name=name).SerializeToString(), timeout=10)
    output = served.process.output  # type: ignore[attr-defined]
    lines = output.splitlines()
    assert not [line for line in lines if line.startswith("2026-01-01")], output
    assert "\x1b" not in output  # text mode: a CR would have ended a line above
    assert sum("forged" in line for line in lines) >= 2, output


# ---- HTTP/2 and gRPC, frame by frame -------------------------------------------------------------

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
DATA, HEADERS, RST_STREAM, SETTINGS, GOAWAY, CONTINUATION = 0, 1, 3, 4, 7, 9
END_STREAM, END_HEADERS = 0x1, 0x4
CANCEL = 8
LIVE = "/inference.GRPCInferenceService/ServerLive"


def _frame(kind: int, flags: int, stream: int, payload: bytes = b"") -> bytes:
    return (
        struct.pack(">I", len(payload))[1:]
        + bytes([kind, flags])
        + struct.pack(">I", stream)
        + payload
    )


def _integer(value: int, bits: int, first: int = 0) -> bytes:
    """HPACK's integer with a ``bits``-bit prefix (RFC 7541 5.1)."""
    top = (1 << bits) - 1
    if value < top:
        return bytes([first | value])
    out, value = [first | top], value - top
    while value >= 128:
        out.append((value & 127) | 128)
        value >>= 7
    return bytes([*out, value])


def _literal(name: str, value: bytes | str, indexed: bool = False) -> bytes:
    """A header field as a literal with a new name, not Huffman-coded (RFC 7541 6.2)."""
    raw_name, raw = name.encode(), value if isinstance(value, bytes) else value.encode()
    return (
        (b"\x40" if indexed else b"\x00")
        + _integer(len(raw_name), 7)
        + raw_name
        + _integer(len(raw), 7)
        + raw
    )


def _call_headers(method: str = LIVE, *extra: bytes) -> bytes:
    fields = ((":method", "POST"), (":scheme", "http"), (":path", method), (":authority", "x"),
              ("content-type", "application/grpc"), ("te", "trailers"))  # fmt: skip
    return b"".join(_literal(k, v) for k, v in fields) + b"".join(extra)


def _h2(port: int) -> socket.socket:
    sock = connect(port)
    sock.sendall(PREFACE + _frame(SETTINGS, 0, 0))
    return sock


def _send_all(sock: socket.socket, frames: Iterator[bytes]) -> None:
    """Write ``frames``, stopping where the server closes the connection (its answer to a
    flood may be to close it)."""
    buffer = b""
    try:
        for frame in frames:
            buffer += frame
            if len(buffer) > 1 << 16:
                sock.sendall(buffer)
                buffer = b""
        sock.sendall(buffer)
    except OSError:
        pass


def _live(faces: ServedFaces) -> bool:
    """Whether a new connection's ServerLive is answered."""
    channel = grpc.insecure_channel(faces.address, options=[("grpc.use_local_subchannel_pool", 1)])
    with channel:
        call = channel.unary_unary("/inference.GRPCInferenceService/ServerLive")
        answer = pb.ServerLiveResponse.FromString(
            call(pb.ServerLiveRequest().SerializeToString(), timeout=10)
        )
    return answer.live


def _vm(pid: int, field: str) -> int:
    with open(f"/proc/{pid}/status") as status:
        return next(int(line.split()[1]) << 10 for line in status if line.startswith(field))


FLOODS = {
    # CVE-2023-44487: streams opened and reset at once, never counted as concurrent
    "rapid reset": lambda: (
        _frame(HEADERS, END_HEADERS, s, _call_headers())
        + _frame(RST_STREAM, 0, s, struct.pack(">I", CANCEL))
        for s in range(1, 40001, 2)
    ),
    # CVE-2024-27316's class: one header block continued without end
    "CONTINUATION flood": lambda: (
        _frame(HEADERS, 0, 1, _call_headers())
        if i < 0
        else _frame(CONTINUATION, 0, 1, _literal(f"x-{i}", "a" * 100))
        for i in range(-1, 40000)
    ),
    "empty CONTINUATION frames": lambda: (
        _frame(HEADERS, 0, 1, _call_headers()) if i < 0 else _frame(CONTINUATION, 0, 1)
        for i in range(-1, 200000)
    ),
    # HPACK bomb: one large field in the dynamic table, then referred to by one byte each
    "HPACK bomb": lambda: iter(
        [
            _frame(
                HEADERS,
                END_HEADERS,
                1,
                _call_headers(LIVE, _literal("x-bomb", "a" * 4000, indexed=True), b"\xbe" * 16000),
            )
        ]
    ),
}


@pytest.mark.parametrize("flood", FLOODS.values(), ids=FLOODS)
def test_http2_floods_leave_the_grpc_face_serving(faces: ServedFaces, flood) -> None:
    """HTTP/2 rapid reset (CVE-2023-44487), the CONTINUATION flood (CVE-2024-27316's class)
    and an HPACK bomb, each on one connection written frame by frame: other clients' calls
    are answered throughout, and the server's memory grows by less than 64 MiB."""
    pid = faces.process.pid
    before = _vm(pid, "VmRSS:")
    with _h2(faces.grpc_port) as sock:
        _send_all(sock, flood())
        assert _live(faces)
    assert _vm(pid, "VmRSS:") - before < 64 << 20
    assert _live(faces)


@pytest.mark.parametrize(
    "metadata",
    [
        [("x-big", "a" * (1 << 20))],
        [(f"x-{i}", "a") for i in range(5000)],
        [("authorization", "Bearer " + "a" * (64 << 10))],
    ],
    ids=["one large value", "many fields", "a large credential"],
)
def test_large_metadata_is_resource_exhausted(faces: ServedFaces, metadata: list) -> None:
    """grpcio CVE-2023-33953 (unbounded memory and CPU for large or many metadata fields): the
    call is RESOURCE_EXHAUSTED and the face keeps serving."""
    with grpc.insecure_channel(faces.address) as channel:
        call = channel.unary_unary("/inference.GRPCInferenceService/ServerLive")
        with pytest.raises(grpc.RpcError) as caught:
            call(pb.ServerLiveRequest().SerializeToString(), metadata=metadata, timeout=10)
    assert caught.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert _live(faces)


@pytest.mark.parametrize("compression", [grpc.Compression.Gzip, grpc.Compression.Deflate])
def test_a_compression_bomb_stops_at_the_message_limit(
    faces: ServedFaces, compression: grpc.Compression
) -> None:
    """A message that inflates past the limit (CWE-409, the decompression bomb; on HTTP, the
    compressed bodies of Triton CVE-2025-23310/23311's class): 64 MiB of zeros sent
    compressed to about 64 KiB is RESOURCE_EXHAUSTED, and the server's peak memory stays
    below what the message would inflate to."""
    pid = faces.process.pid
    request = pb.ModelInferRequest(model_name="digits-mlp", raw_input_contents=[bytes(64 << 20)])
    request.inputs.add(name="input", datatype="FP32", shape=[(64 << 20) // 256, 64])
    before = _vm(pid, "VmHWM:")
    with grpc.insecure_channel(
        faces.address, options=[("grpc.max_send_message_length", -1)]
    ) as channel:
        call = channel.unary_unary("/inference.GRPCInferenceService/ModelInfer")
        with pytest.raises(grpc.RpcError) as caught:
            call(request.SerializeToString(), compression=compression, timeout=30)
    assert caught.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, caught.value.details()
    assert _vm(pid, "VmHWM:") - before < 32 << 20
    assert _live(faces)


def test_messages_that_do_not_inflate_leave_no_traceback(model_repository: Path) -> None:
    """grpcio's core answers a message it cannot decompress itself (gzip that is no gzip, an
    encoding it does not know, a compressed flag with no encoding); the method then reads no
    message, and ending that call raised from grpcio once the core had ended it: an ERROR
    traceback per call, a way for any client to flood the log. 4,000 such calls on 40
    connections: each ended, no traceback (checked when the server stops), the face serving."""
    bad = [
        (_literal("grpc-encoding", "gzip"), b"\x01\x00\x00\x00\x03abc"),
        (_literal("grpc-encoding", "deflate"), b"\x01\x00\x00\x00\x03abc"),
        (_literal("grpc-encoding", "br"), b"\x01\x00\x00\x00\x03abc"),
        (b"", b"\x01\x00\x00\x00\x03abc"),
    ]
    methods = ("ServerLive", "ModelInfer", "ModelMetadata", "RepositoryIndex")
    with grpc_server(model_repository) as served:
        for round_ in range(40):
            with _h2(served.grpc_port) as sock:
                frames = []
                for i, stream in enumerate(range(1, 201, 2)):
                    extra, data = bad[(i + round_) % len(bad)]
                    method = f"/inference.GRPCInferenceService/{methods[i % len(methods)]}"
                    frames.append(_frame(HEADERS, END_HEADERS, stream, _call_headers(method, extra))
                                  + _frame(DATA, END_STREAM, stream, data))  # fmt: skip
                _send_all(sock, iter(frames))
                sock.settimeout(0.1)
                try:
                    while sock.recv(1 << 16):
                        pass
                except OSError:
                    pass
        assert _live(served)
