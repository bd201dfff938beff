"""TLS and mutual TLS on both faces, with certificates made for the test (trustme), against a
real ``gelu-serve serve``: curl, httpx and tritonclient over HTTP, tritonclient and grpcio over
gRPC; a plaintext client on the TLS port; a certificate replaced while serving."""

from __future__ import annotations

import http.client
import json
import shutil
import socket
import ssl
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from service.settings import SettingsError, load_settings
from tests.helpers import DIGITS
from tests.servers import ROOT, environment, free_port, probed, wait_until

trustme = pytest.importorskip("trustme")  # the [dev] extra
PREDICT = "/v1/models/digits-mlp:predict"
BODY = json.dumps({"instances": [DIGITS[0].tolist()]}).encode()


@dataclass
class Pki:
    """A CA, the server's certificate from it, and a client's; each as files."""

    ca: Any  # trustme.CA
    ca_file: Path
    cert_file: Path
    key_file: Path
    client_cert: Path  # the client's certificate and key, in one PEM
    folder: Path

    def context(self, client: bool = False) -> ssl.SSLContext:
        context = ssl.create_default_context(cafile=str(self.ca_file))
        if client:
            context.load_cert_chain(self.client_cert)
        return context

    def reissue(self) -> str:
        """A new server certificate from the same CA written over the files; its serial."""
        issued = self.ca.issue_cert("127.0.0.1", "localhost")
        staged = self.folder / "staged"
        staged.mkdir(exist_ok=True)
        (staged / "key.pem").write_bytes(issued.private_key_pem.bytes())
        (staged / "cert.pem").write_bytes(b"".join(p.bytes() for p in issued.cert_chain_pems))
        shutil.move(staged / "key.pem", self.key_file)  # key first: a pair that will match
        shutil.move(staged / "cert.pem", self.cert_file)
        return _serial(issued.cert_chain_pems[0].bytes())


def _serial(pem: bytes) -> str:
    from cryptography import x509

    return format(x509.load_pem_x509_certificate(pem).serial_number, "x")


@pytest.fixture()
def pki(tmp_path: Path) -> Pki:
    ca = trustme.CA()
    server = ca.issue_cert("127.0.0.1", "localhost")
    client = ca.issue_cert("client@example.com")
    files = Pki(ca, tmp_path / "ca.pem", tmp_path / "cert.pem", tmp_path / "key.pem",
                tmp_path / "client.pem", tmp_path)  # fmt: skip
    ca.cert_pem.write_to_path(str(files.ca_file))
    server.private_key_pem.write_to_path(str(files.key_file))
    files.cert_file.write_bytes(b"".join(p.bytes() for p in server.cert_chain_pems))
    client.private_key_and_cert_chain_pem.write_to_path(str(files.client_cert))
    return files


def _https(port: int, context: ssl.SSLContext, path: str = "/v2/health/ready",
           body: bytes | None = None) -> tuple[int, bytes, str]:  # fmt: skip
    """Status, body and the serial of the certificate the server presented."""
    connection = http.client.HTTPSConnection("127.0.0.1", port, context=context, timeout=10)
    try:
        if body is None:
            connection.request("GET", path)
        else:
            connection.request("POST", path, body, {"Content-Type": "application/json"})
        response = connection.getresponse()
        assert connection.sock is not None
        served = connection.sock.getpeercert(binary_form=True)
        assert served is not None
        from cryptography import x509

        serial = format(x509.load_der_x509_certificate(served).serial_number, "x")
        return response.status, response.read(), serial
    finally:
        connection.close()


@contextmanager
def tls_server(
    repository: Path, pki: Pki, client_auth: str = "none", **settings: str
) -> Iterator[tuple[int, int, subprocess.Popen[str]]]:
    grpc_port = free_port()
    env = {"GELU_TLS_CERT_FILE": str(pki.cert_file), "GELU_TLS_KEY_FILE": str(pki.key_file),
           "GELU_GRPC_PORT": str(grpc_port), "GELU_TLS_CLIENT_AUTH": client_auth,
           **{f"GELU_{name.upper()}": value for name, value in settings.items()}}  # fmt: skip
    if client_auth != "none":
        env["GELU_TLS_CLIENT_CA_FILE"] = str(pki.ca_file)
    context = pki.context(client=client_auth != "none")
    with probed(repository, lambda port: _https(port, context)[0], env) as (port, process):
        yield port, grpc_port, process


@pytest.mark.slow
def test_tls_on_both_faces_with_every_client(model_repository: Path, pki: Pki) -> None:
    import httpx
    import tritonclient.grpc as grpcclient
    import tritonclient.http as httpclient

    with tls_server(model_repository, pki) as (port, grpc_port, _):
        status, body, _ = _https(port, pki.context(), PREDICT, BODY)
        assert status == 200 and "label" in json.loads(body)["predictions"][0]
        curl = subprocess.run(
            ["curl", "-sS", "--cacert", str(pki.ca_file), f"https://localhost:{port}/v2"],
            capture_output=True, text=True, timeout=30,
        )  # fmt: skip
        assert curl.returncode == 0 and json.loads(curl.stdout)["name"] == "gelu-serve"
        tls12 = subprocess.run(
            ["curl", "-sS", "--cacert", str(pki.ca_file), "--tlsv1.1", "--tls-max", "1.1",
             f"https://localhost:{port}/v2"], capture_output=True, text=True, timeout=30,
        )  # fmt: skip
        assert tls12.returncode != 0  # below Mozilla intermediate's TLS 1.2
        with httpx.Client(verify=pki.context()) as client:
            assert client.get(f"https://127.0.0.1:{port}/v2/health/live").status_code == 200
        http = httpclient.InferenceServerClient(
            f"127.0.0.1:{port}", ssl=True, ssl_context_factory=pki.context
        )
        assert http.is_server_ready()
        grpc_client = grpcclient.InferenceServerClient(
            f"localhost:{grpc_port}", ssl=True, root_certificates=str(pki.ca_file)
        )
        x = grpcclient.InferInput("input", [1, 64], "FP32")
        x.set_data_from_numpy(np.ascontiguousarray(DIGITS[:1]))
        assert grpc_client.infer("digits-mlp", [x]).as_numpy("probabilities").shape == (1, 10)
        # A plaintext client on the TLS port: a clean failure, and the server keeps serving.
        plain = http_client_plaintext(port)
        assert plain is None or not plain.startswith(b"HTTP/1.1 200")
        assert _https(port, pki.context())[0] == 200
        tls_env = {"GELU_TLS_CERT_FILE": str(pki.cert_file), "GELU_TLS_KEY_FILE": str(pki.key_file)}
        assert _probe(port, tls_env) == 0
        assert _probe(free_port(), tls_env) == 1  # nothing there


def stalled_handshake_closed(port: int) -> bool:
    """Whether a client that starts a TLS handshake and stalls is closed within 15 s."""
    with socket.create_connection(("127.0.0.1", port), timeout=15) as sock:
        sock.sendall(b"\x16\x03\x01")  # the first bytes of a ClientHello record, no more
        try:
            return sock.recv(100) == b""
        except TimeoutError:
            return False
        except OSError:  # reset: closed too
            return True


def http_client_plaintext(port: int) -> bytes | None:
    """What a plaintext HTTP request to ``port`` reads back (None: the connection closed)."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(b"GET /v2/health/ready HTTP/1.1\r\nHost: x\r\n\r\n")
        try:
            return sock.recv(100) or None
        except OSError:
            return None


@pytest.mark.slow
def test_mutual_tls_admits_only_clients_with_a_certificate(
    model_repository: Path, pki: Pki
) -> None:
    import grpc
    import tritonclient.grpc as grpcclient

    with tls_server(model_repository, pki, client_auth="required", header_timeout_seconds="2") as (
        port, grpc_port, _,
    ):  # fmt: skip
        # A stalled handshake is timed out like slow headers, on both faces (asyncio's own
        # bound is 60 s), and the server goes on serving.
        assert stalled_handshake_closed(port) and stalled_handshake_closed(grpc_port)
        assert _https(port, pki.context(client=True), PREDICT, BODY)[0] == 200
        with pytest.raises((ssl.SSLError, ConnectionError, OSError)):
            _https(port, pki.context(client=False))
        curl = subprocess.run(
            ["curl", "-sS", "--cacert", str(pki.ca_file), "--cert", str(pki.client_cert),
             f"https://localhost:{port}/v2/health/live"], capture_output=True, text=True,
            timeout=30,
        )  # fmt: skip
        assert curl.returncode == 0, curl.stderr
        key_and_chain = pki.client_cert.read_bytes()
        with_cert = grpcclient.InferenceServerClient(
            f"localhost:{grpc_port}", ssl=True, root_certificates=str(pki.ca_file),
            private_key=str(pki.client_cert), certificate_chain=str(pki.client_cert),
        )  # fmt: skip
        assert key_and_chain and with_cert.is_server_live()
        without = grpc.secure_channel(
            f"localhost:{grpc_port}", grpc.ssl_channel_credentials(pki.ca_file.read_bytes())
        )
        from service.grpc import inference_pb2 as pb
        from service.grpc import inference_pb2_grpc as pb_grpc

        with pytest.raises(grpc.RpcError) as refused:
            pb_grpc.GRPCInferenceServiceStub(without).ServerLive(pb.ServerLiveRequest(), timeout=10)
        assert refused.value.code() == grpc.StatusCode.UNAVAILABLE
        without.close()
        # The probe for Docker and Kubernetes: with the probe's certificate, and without.
        env = {"GELU_TLS_CERT_FILE": str(pki.cert_file), "GELU_TLS_KEY_FILE": str(pki.key_file),
               "GELU_TLS_CLIENT_CA_FILE": str(pki.ca_file),
               "GELU_TLS_CLIENT_AUTH": "required"}  # fmt: skip
        assert _probe(port, {**env, "GELU_TLS_PROBE_CERT_FILE": str(pki.client_cert)}) == 0
        assert _probe(port, env) == 1


def _probe(port: int, env: dict[str, str]) -> int:
    """``gelu-serve health``'s exit status against ``port``."""
    import sys

    return subprocess.run(
        [sys.executable, "-m", "cli", "health", "--port", str(port)],
        cwd=ROOT, env=environment(None, env), capture_output=True, timeout=30,
    ).returncode  # fmt: skip


@pytest.mark.slow
def test_a_replaced_certificate_is_served_without_a_restart(
    model_repository: Path, pki: Pki
) -> None:
    import grpc

    with tls_server(model_repository, pki) as (port, grpc_port, process):
        first = _https(port, pki.context())[2]
        serial = pki.reissue()
        assert serial != first
        new = "the new certificate served"
        wait_until(lambda: _https(port, pki.context())[2] == serial, 10, 0.2, new)
        # gRPC: a new connection's handshake presents the new certificate.
        server_pem = ssl.get_server_certificate(("127.0.0.1", grpc_port)).encode()
        assert _serial(server_pem) == serial
        channel = grpc.secure_channel(
            f"localhost:{grpc_port}", grpc.ssl_channel_credentials(pki.ca_file.read_bytes())
        )
        grpc.channel_ready_future(channel).result(timeout=10)
        channel.close()
        assert process.poll() is None  # the same process throughout


def test_tls_settings_are_checked_together(pki: Pki, tmp_path: Path) -> None:
    with pytest.raises(SettingsError, match="set both, or neither"):
        load_settings(tls_cert_file=pki.cert_file)
    with pytest.raises(SettingsError, match="needs GELU_TLS_CLIENT_CA_FILE"):
        load_settings(tls_cert_file=pki.cert_file, tls_key_file=pki.key_file,
                      tls_client_auth="required")  # fmt: skip
    with pytest.raises(SettingsError, match="no such file"):
        load_settings(tls_cert_file=tmp_path / "nope.pem", tls_key_file=pki.key_file)
    settings = load_settings(tls_cert_file=pki.cert_file, tls_key_file=pki.key_file)
    assert settings.tls_client_auth == "none"


def _client(pki: Pki, ca: Any, name: str) -> ssl.SSLContext:
    """A client context trusting the server's CA, with a certificate ``ca`` signed."""
    pem = pki.folder / f"{name}.pem"
    ca.issue_cert(f"{name}@example.com").private_key_and_cert_chain_pem.write_to_path(str(pem))
    context = pki.context()
    context.load_cert_chain(pem)
    return context


def _replace_client_ca(pki: Pki, path: Path) -> Any:
    """A new CA written over the client-CA file ``path`` (renamed into place); the CA."""
    new = trustme.CA()
    staged = pki.folder / "staged-ca.pem"
    new.cert_pem.write_to_path(str(staged))
    shutil.move(staged, path)
    return new


def _admitted(port: int, context: ssl.SSLContext) -> bool:
    try:
        return _https(port, context)[0] == 200
    except (ssl.SSLError, ConnectionError, OSError):
        return False


def test_a_replaced_client_ca_replaces_the_trusted_cas(pki: Pki) -> None:
    """Issue 62 item 11: a replaced client-CA file was loaded into the serving context on top of
    the old CAs, so certificates of a retired CA were still admitted. Now a new context is made
    from the files and handshakes move to it: the old CA's clients are refused (and TLS 1.3
    cannot resume their sessions: no tickets), the new CA's admitted."""
    import asyncio

    from service.tls import TlsFiles

    client_ca = pki.folder / "client-ca.pem"
    shutil.copy(pki.ca_file, client_ca)
    files = TlsFiles(pki.cert_file, pki.key_file, client_ca, "required")
    files._read = files.stamp()
    old_client = _client(pki, pki.ca, "old")

    async def served() -> tuple[list[bool], list[bool]]:
        async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            try:
                await reader.readuntil(b"\r\n\r\n")
                writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n")
                await writer.drain()
            except (OSError, asyncio.IncompleteReadError):
                pass
            writer.close()

        listening = files.context()
        files.serve_with(listening)
        server = await asyncio.start_server(answer, "127.0.0.1", 0, ssl=listening)
        port = server.sockets[0].getsockname()[1]
        try:
            before = await asyncio.to_thread(_admitted, port, old_client)
            new_client = _client(pki, _replace_client_ca(pki, client_ca), "new")
            assert files.reload()
            after = [await asyncio.to_thread(_admitted, port, c) for c in (old_client, new_client)]
            return [before], after
        finally:
            server.close()

    before, after = asyncio.run(served())
    assert before == [True] and after == [False, True]


@pytest.mark.slow
def test_a_replaced_client_ca_is_the_only_one_trusted_on_both_faces(
    model_repository: Path, pki: Pki
) -> None:
    """The same against a real server: HTTP reads the replaced file within a second, gRPC at
    the next handshake; a certificate signed only by the old CA is refused on both."""
    import grpc

    from service.grpc import inference_pb2 as pb
    from service.grpc import inference_pb2_grpc as pb_grpc

    client_ca = pki.folder / "client-ca.pem"
    shutil.copy(pki.ca_file, client_ca)
    grpc_port = free_port()
    env = {"GELU_TLS_CERT_FILE": str(pki.cert_file), "GELU_TLS_KEY_FILE": str(pki.key_file),
           "GELU_TLS_CLIENT_CA_FILE": str(client_ca), "GELU_TLS_CLIENT_AUTH": "required",
           "GELU_GRPC_PORT": str(grpc_port)}  # fmt: skip
    old_client = _client(pki, pki.ca, "old")

    def grpc_live(pem: Path) -> bool:
        key_and_chain = pem.read_bytes()
        credentials = grpc.ssl_channel_credentials(pki.ca_file.read_bytes(), key_and_chain,
                                                   key_and_chain)  # fmt: skip
        with grpc.secure_channel(f"localhost:{grpc_port}", credentials) as channel:
            stub = pb_grpc.GRPCInferenceServiceStub(channel)
            try:
                return stub.ServerLive(pb.ServerLiveRequest(), timeout=5).live
            except grpc.RpcError:
                return False

    with probed(model_repository, lambda port: _https(port, old_client)[0], env) as (port, _):
        assert grpc_live(pki.folder / "old.pem")
        new_client = _client(pki, _replace_client_ca(pki, client_ca), "new")
        old = "the old CA's client refused"
        wait_until(lambda: not _admitted(port, old_client), 10, 0.2, old)
        assert _admitted(port, new_client)
        assert not grpc_live(pki.folder / "old.pem") and grpc_live(pki.folder / "new.pem")
