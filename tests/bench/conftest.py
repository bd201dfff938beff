"""The bench's fixtures: a stand-in HTTP server that answers as a test says, and a private
repository for a run of the benchmark."""

from __future__ import annotations

import http.server
import shutil
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

Answer = Callable[[str], tuple[int, bytes]]  # a POST's path -> the status and body answered


@pytest.fixture
def stub_server() -> Iterator[Callable[[Answer], str]]:
    """``stub_server(answer)``: the URL of a server on a thread of the test's process that
    answers every POST with ``answer(path)``, over keep-alive connections as real servers do
    (wrk keeps its own); stopped after the test."""
    servers: list[http.server.ThreadingHTTPServer] = []

    def serve(answer: Answer) -> str:
        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_POST(self) -> None:
                self.rfile.read(int(self.headers["Content-Length"]))
                status, body = answer(self.path)
                self.send_response(status)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: object) -> None:
                pass

        server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        servers.append(server)
        return f"http://127.0.0.1:{server.server_address[1]}"

    yield serve
    for server in servers:
        server.shutdown()
        server.server_close()


@pytest.fixture
def bench_repository(tmp_path: Path, model_repository: Path) -> Path:
    """A private copy of the test repository: a benchmark run builds the default models it
    lacks (the ensemble) into the repository it is given, which the session's shared one must
    never gain."""
    root = tmp_path / "repository"
    shutil.copytree(model_repository, root)
    return root
