"""Drive one endpoint with wrk (a C load generator, pinned to its own core, as a batch job:
``bench.proc.client_command``) and read its figures back as JSON from a Lua ``done`` hook."""

from __future__ import annotations

import json
import random
import resource
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.proc import client_command

_SCRIPT = """
wrk.method = "POST"
local f = io.open("{body}", "rb")
wrk.body = f:read("*all")
f:close()
{headers}
{unique}
done = function(summary, latency, requests)
  local e = summary.errors
  io.write(string.format(
    '\\nWRKJSON {{"requests":%d,"duration_us":%d,"bytes":%d,"status_errors":%d,'
    .. '"socket_errors":%d,"p50_us":%d,"p99_us":%d,"max_us":%d}}\\n',
    summary.requests, summary.duration, summary.bytes, e.status,
    e.connect + e.read + e.write + e.timeout,
    latency:percentile(50), latency:percentile(99), latency.max))
end
"""


# A body whose requests must all differ (a response cache's misses): wrk writes two numbers in
# place of this marker, a pair new in each request, from a start new for each run. Two: a JSON
# number becomes a float32, exact only below 2**24; the pair counts to 2**36 exactly.
UNIQUE = b"UNIQUE"
_UNIQUE_SCRIPT = """
local head, tail = wrk.body:match("^(.-)UNIQUE(.*)$")
local n = {start}
request = function()
  n = n + 1
  local pair = string.format("%.0f, %.0f", math.floor(n / 4096), n % 4096)
  return wrk.format(nil, nil, nil, head .. pair .. tail)
end
"""


@dataclass(frozen=True)
class Request:
    """What every request of a run sends (with ``UNIQUE`` in ``body``: two numbers in its
    place, a pair different in every request)."""

    path: str
    body: bytes
    headers: dict[str, str]


def run_wrk(
    base_url: str, request: Request, connections: int, seconds: float, cpu: int | None
) -> dict[str, Any]:
    """Successful answers per second (only 2xx and 3xx count: an error answer is no
    throughput), p50 and p99 in ms, errors (non-2xx or socket), the request's size and the
    cores wrk used, for one wrk run."""
    with tempfile.TemporaryDirectory() as tmp:
        body = Path(tmp) / "body"
        body.write_bytes(request.body)
        headers = "\n".join(
            f"wrk.headers[{json.dumps(k)}] = {json.dumps(v)}" for k, v in request.headers.items()
        )
        script = Path(tmp) / "script.lua"
        unique = ""
        if UNIQUE in request.body:
            unique = _UNIQUE_SCRIPT.format(start=random.randrange(1 << 35))
        script.write_text(_SCRIPT.format(body=body, headers=headers, unique=unique))
        command = [
            "wrk",
            "-t1",
            f"-c{connections}",
            f"-d{max(1, round(seconds))}s",
            "--timeout",
            "10s",
            "-s",
            str(script),
            base_url + request.path,
        ]
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        output = subprocess.run(
            client_command(command, cpu),
            capture_output=True,
            text=True,
            timeout=seconds + 60,
            check=True,
        ).stdout
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
    line = next(x for x in output.splitlines() if x.startswith("WRKJSON "))
    raw = json.loads(line.removeprefix("WRKJSON "))
    seconds_run = raw["duration_us"] / 1e6
    answered = max(0, raw["requests"] - raw["status_errors"])
    errors = raw["status_errors"] + raw["socket_errors"]
    if not answered:
        # wrk counts no request still in flight at the end: a server too slow to answer one
        # within the run reads 0 requests and 0 errors. Each connection's request went
        # unanswered, so the point counts as failed, never as an error-free 0 req/s.
        errors = max(errors, connections)
    return {
        "requests": raw["requests"],
        "request_bytes": len(request.body),
        "rps": answered / seconds_run,
        "p50_ms": raw["p50_us"] / 1000,
        "p99_ms": raw["p99_us"] / 1000,
        "errors": errors,
        # wrk's own CPU time over the run (it is this process's only child meanwhile)
        "client_cores": (after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime)
        / seconds_run,
    }
