"""bench.measure: the order a pass drives its points in, and a peer's answer read."""

from __future__ import annotations

import json

import pytest


def test_a_pass_drives_batching_on_and_off_one_after_the_other() -> None:
    """Every pass drives every scenario once, starting at a different one; batching on and off
    of one protocol one right after the other, in the other order every other pass."""
    from bench.measure import drive_order

    groups = [["floor"], ["naive"], ["v1 on", "v1 off"], ["v2 on", "v2 off"]]
    passes = [drive_order(groups, i, 3) for i in range(3)]
    assert passes == [
        ["floor", "naive", "v1 on", "v1 off", "v2 on", "v2 off"],
        ["naive", "v1 off", "v1 on", "v2 off", "v2 on", "floor"],
        ["v1 on", "v1 off", "v2 on", "v2 off", "floor", "naive"],
    ]


def test_a_peers_answer_is_read_as_the_models_probabilities() -> None:
    """Before a pass is timed, each peer's answer is compared with the model's: read from a V2
    JSON answer (MLServer's) or a JSON list (BentoML's); an error answer stops the run."""
    import http.server
    import threading

    from bench.launch import Server
    from bench.measure import answer
    from bench.wrk import Request

    v2 = {"outputs": [{"name": "probabilities", "shape": [1, 2], "data": [0.25, 0.75]}]}
    answers = {"/v2": v2, "/list": [[0.25, 0.75]]}

    class Peer(http.server.BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            self.rfile.read(int(self.headers["Content-Length"]))
            body = json.dumps(answers.get(self.path, {"error": "no"})).encode()
            self.send_response(200 if self.path in answers else 500)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Peer)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    peer = Server(f"http://127.0.0.1:{server.server_address[1]}", 0, {0})
    try:
        for path in answers:
            got = answer(peer, Request(path, b"{}", {"Content-Type": "application/json"}))
            assert got.tolist() == [[0.25, 0.75]]
        with pytest.raises(AssertionError, match="answered 500"):
            answer(peer, Request("/broken", b"{}", {}))
    finally:
        server.shutdown()
