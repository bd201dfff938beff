"""Overload, deadlines and what a client can make the service hold: in process, concurrent."""

from __future__ import annotations

import asyncio
import gzip
import zlib
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import httpx
import pytest

from service.rest.app import create_app
from tests.helpers import DIGITS, assert_error

V1 = "/v1/models/slow:predict"
ROW = DIGITS[0].tolist()


@asynccontextmanager
async def serving(settings_factory, **overrides) -> AsyncIterator[httpx.AsyncClient]:
    """An async client over the real app, its lifespan run; batches on worker threads."""
    app = create_app(settings_factory(inline_max_us=0, **overrides))
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
            yield client


def slow_settings(settings_factory, slow_repository: Path):
    def make(**overrides):
        return settings_factory(model_repository=slow_repository, **overrides)

    return make


async def burst(client: httpx.AsyncClient, count: int, body: dict) -> list[httpx.Response]:
    return await asyncio.gather(*(client.post(V1, json=body) for _ in range(count)))


def test_a_full_queue_answers_503_with_retry_after(settings_factory, slow_repository) -> None:
    async def scenario() -> None:
        make = slow_settings(settings_factory, slow_repository)
        async with serving(make, max_queue_size=4) as client:
            responses = await burst(client, 40, {"instances": [ROW]})
            codes = [r.status_code for r in responses]
            assert set(codes) == {200, 503}, codes
            assert codes.count(200) >= 4
            refused = next(r for r in responses if r.status_code == 503)
            assert refused.headers["retry-after"] == "1"
            assert_error(refused, 503, "GELU_MAX_QUEUE_SIZE")
            # The queue drained: the service serves again.
            assert (await client.post(V1, json={"instances": [ROW]})).status_code == 200

    asyncio.run(scenario())


def test_a_request_past_its_timeout_is_refused_not_run_late(
    settings_factory, slow_repository
) -> None:
    async def scenario() -> None:
        make = slow_settings(settings_factory, slow_repository)
        async with serving(make) as client:
            entry = {"name": "input", "shape": [1, 64], "datatype": "FP32", "data": ROW}
            body = {"inputs": [entry], "parameters": {"timeout": 1}}  # 1 µs, as Triton's
            responses = await asyncio.gather(
                *(client.post("/v2/models/slow/infer", json=body) for _ in range(20))
            )
            late = [r for r in responses if r.status_code == 503]
            assert late, [r.status_code for r in responses]
            assert_error(late[0], 503, "Request timeout expired")
            assert late[0].headers["retry-after"] == "1"
            stats = (await client.get("/v2/models/slow/stats")).json()["model_stats"][0]
            # Refused requests never ran: every sample that ran belongs to a 200.
            ran = stats["inference_count"]
            assert ran == sum(r.status_code == 200 for r in responses)
            # Without a timeout the same burst runs whole.
            del body["parameters"]
            ok = await asyncio.gather(
                *(client.post("/v2/models/slow/infer", json=body) for _ in range(20))
            )
            assert {r.status_code for r in ok} == {200}

    asyncio.run(scenario())


def test_a_default_timeout_applies_to_every_request(settings_factory, slow_repository) -> None:
    async def scenario() -> None:
        make = slow_settings(settings_factory, slow_repository)
        async with serving(make, default_timeout_us=1) as client:
            codes = [r.status_code for r in await burst(client, 20, {"instances": [ROW]})]
            assert 503 in codes, codes

    asyncio.run(scenario())


def test_a_client_that_goes_away_has_its_queued_request_dropped(
    settings_factory, slow_repository
) -> None:
    """Requests cancelled while queued (as the server cancels a lost connection's) never
    run; the others are answered."""

    async def scenario() -> None:
        make = slow_settings(settings_factory, slow_repository)
        async with serving(make) as client:
            tasks = [
                asyncio.create_task(client.post(V1, json={"instances": [ROW] * 8}))
                for _ in range(30)
            ]
            await asyncio.sleep(0.003)  # the first batches run; the rest wait
            for task in tasks[5:]:
                task.cancel()
            done = await asyncio.gather(*tasks, return_exceptions=True)
            answered = [r for r in done if isinstance(r, httpx.Response)]
            assert all(r.status_code == 200 for r in answered)
            stats = (await client.get("/v2/models/slow/stats")).json()["model_stats"][0]
            assert stats["inference_count"] < 30 * 8, stats["inference_count"]
            assert (await client.post(V1, json={"instances": [ROW]})).status_code == 200

    asyncio.run(scenario())


# ---- what a client can make the service hold --------------------------------------------------


def test_client_strings_never_become_metric_labels(client) -> None:
    """Distinct unknown names, paths and methods add no label sets once each route and status
    has been seen: /metrics stays the same size, however many of them arrive."""

    def hostile(start: int, count: int) -> int:
        for i in range(start, start + count):
            client.post(f"/v1/models/m{i}:predict", json={"instances": [[0.0]]})
            client.get(f"/v2/models/m{i}/ready")
            client.delete(f"/v2/models/m{i}/infer")
            client.post(f"/v1/activations/a{i}", json={"data": [1.0]})
            client.post(f"/v1/activations/gelu?derivative=x{i}", json={"data": [1.0]})
            client.get(f"/nowhere/{i}")
        return len(client.get("/metrics").text)

    seen = hostile(0, 20)
    # 1,200 more requests with new strings: only counts and sums change (a few digits).
    assert hostile(20, 200) - seen < 2_000


# ---- compressed bodies --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("encoding", "compress"),
    [("gzip", gzip.compress), ("deflate", zlib.compress)],
)
def test_compressed_bodies_are_decoded(client, encoding, compress) -> None:
    import orjson

    body = orjson.dumps({"instances": [ROW]})
    plain = client.post("/v1/models/digits-mlp:predict", content=body)
    packed = client.post(
        "/v1/models/digits-mlp:predict",
        content=compress(body),
        headers={"Content-Encoding": encoding, "Content-Type": "application/json"},
    )
    assert packed.status_code == 200, packed.text
    assert packed.content == plain.content
    # Counted as the plain one is, with the version that served it: the decoded request's
    # scope is the one the metrics read.
    counted = [
        line
        for line in client.get("/metrics").text.splitlines()
        if line.startswith('gelu_requests_total{code="200"') and ":predict" in line
    ]
    assert len(counted) == 1 and 'model="digits-mlp"' in counted[0], counted
    assert 'version=""' not in counted[0], counted


def test_a_decompression_bomb_stops_at_the_limit(client) -> None:
    bomb = gzip.compress(b" " * (4 << 20))  # 4 MiB of spaces in about 4 KiB; limit 1 MiB
    assert len(bomb) < 10_000
    response = client.post(
        "/v1/models/digits-mlp:predict", content=bomb, headers={"Content-Encoding": "gzip"}
    )
    assert_error(response, 413, "decompresses to more than the maximum of 1048576")


@pytest.mark.parametrize(
    ("encoding", "body", "status", "needle"),
    [
        ("br", b"{}", 415, "Content-Encoding 'br' is not supported"),
        ("gzip", b"not gzip at all", 400, "not valid gzip data"),
        ("gzip", gzip.compress(b'{"instances": []}')[:-12], 400, "truncated gzip"),
        ("deflate", b"\x00\x01\x02", 400, "not valid deflate data"),
    ],
)
def test_bad_compressed_bodies(client, encoding, body, status, needle) -> None:
    response = client.post(
        "/v1/models/digits-mlp:predict", content=body, headers={"Content-Encoding": encoding}
    )
    assert_error(response, status, needle)
    assert client.get("/v2/health/live").status_code == 200
