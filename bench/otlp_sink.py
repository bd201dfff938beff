"""An OTLP/HTTP endpoint that takes every export and keeps nothing: where ``make bench``'s
traced servers send their spans, so that the rows price making and exporting them.

    python -m bench.otlp_sink PORT
"""

from __future__ import annotations

import http.server
import sys


class Sink(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # the exporter keeps its connection

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length", 0)))
        self._answer()

    def do_GET(self) -> None:  # readiness, for bench.launch.serve
        self._answer()

    def _answer(self) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "application/x-protobuf")
        self.send_header("Content-Length", "0")  # an empty ExportTraceServiceResponse
        self.end_headers()

    def log_message(self, *args: object) -> None:
        pass


def main() -> None:
    http.server.ThreadingHTTPServer(("127.0.0.1", int(sys.argv[1])), Sink).serve_forever()


if __name__ == "__main__":
    main()
