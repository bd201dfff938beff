"""bench.wrk: wrk's counts, successes only."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest


def test_wrk_counts_successes_only(tmp_path: Path) -> None:
    """Through wrk itself, against a server that answers every other request with 503."""
    if shutil.which("wrk") is None:
        pytest.skip("wrk missing: `make tools` installs it")
    import http.server
    import threading

    from bench.wrk import Request, run_wrk

    class Flaky(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        served = 0

        def do_POST(self) -> None:
            self.rfile.read(int(self.headers["Content-Length"]))
            Flaky.served += 1
            self.send_response(503 if Flaky.served % 2 else 200)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Flaky)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        row = run_wrk(f"http://127.0.0.1:{server.server_address[1]}", Request("/", b"x", {}),
                      1, 1, None)  # fmt: skip
    finally:
        server.shutdown()
    assert row["errors"] >= row["requests"] // 2 - 1 > 0
    answered = row["requests"] - row["errors"]
    assert row["rps"] < row["requests"] * 0.6 and row["rps"] >= answered * 0.5  # successes only
