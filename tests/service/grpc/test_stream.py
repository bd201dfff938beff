"""Triton's ModelStreamInfer against a real `gelu-serve serve`: many requests on one call, each
answered as ModelInfer answers it, in the order sent; failures in band (or ending the call, when
asked); the requests of one stream joining batches; a client that stops reading holds no more
than the stream's window."""

from __future__ import annotations

import asyncio
import itertools
import queue
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from service.grpc import inference_pb2 as pb
from service.grpc.server import STREAM_WINDOW, Window
from tests.helpers import DIGITS
from tests.servers import ServedFaces, get, grpc_server, wait_until
from tests.service.grpc.messages import BAD, raw_request, runs_of_digits_mlp, typed_request

# grpcio refuses a message above the limit itself, ending the call (test below); the core's
# refusals are the stream's to answer in band.
IN_BAND = [bad for bad in BAD if bad[2] != "larger than max"]
(TOO_LARGE,) = [build for build, _, needle in BAD if needle == "larger than max"]


@pytest.fixture(scope="module")
def server(model_repository: Path) -> Iterator[ServedFaces]:
    with grpc_server(model_repository) as server:
        yield server


def _identified(request: pb.ModelInferRequest, request_id: str) -> pb.ModelInferRequest:
    request.id = request_id
    return request


@pytest.mark.slow
def test_each_request_is_answered_in_the_order_sent_as_model_infer_answers_it(
    server: ServedFaces,
) -> None:
    """Good requests between every kind of bad one: the good ones' outputs are ModelInfer's,
    byte for byte; a bad one gets ModelInfer's message in band, with its id, and the stream
    goes on; the metrics count each request."""
    stub = server.stub()
    requests, expected = [], []
    for i, (build, _code, needle) in enumerate(IN_BAND):
        for j, request in enumerate((raw_request(DIGITS[i : i + 2]), build())):
            request_id = f"{i}.{j}"
            if j == 0:
                unary = stub.ModelInfer(raw_request(DIGITS[i : i + 2]))
                expected.append((request_id, "", list(unary.raw_output_contents)))
            else:
                with pytest.raises(grpc.RpcError) as unary_error:
                    stub.ModelInfer(build())
                assert needle in unary_error.value.details()
                expected.append((request_id, unary_error.value.details(), []))
            requests.append(_identified(request, request_id))
    answers = list(stub.ModelStreamInfer(iter(requests), timeout=60))
    got = [
        (a.infer_response.id, a.error_message, list(a.infer_response.raw_output_contents))
        for a in answers
    ]
    assert got == expected
    metrics = get(server.http_port, "/metrics")[1].decode()
    line = 'gelu_requests_total{code="200",endpoint="grpc:ModelStreamInfer",model="digits-mlp"'
    assert f'{line},version="2"}} {float(len(IN_BAND))}' in metrics
    assert 'endpoint="grpc:ModelStreamInfer",model="nope"' not in metrics  # no client's label


@pytest.mark.slow
def test_typed_contents_are_answered_in_kind(server: ServedFaces) -> None:
    (answer,) = server.stub().ModelStreamInfer(iter([typed_request(DIGITS[:3])]), timeout=30)
    assert not answer.error_message and not answer.infer_response.raw_output_contents
    assert [list(o.shape) for o in answer.infer_response.outputs] == [[3, 10], [3, 10]]


@pytest.mark.slow
def test_the_first_failure_ends_the_call_when_the_client_asks(server: ServedFaces) -> None:
    """Triton's `triton_grpc_error` header: the answers before the failure, then its status."""
    requests = [raw_request(DIGITS[:1]), pb.ModelInferRequest(model_name="nope")]
    call = server.stub().ModelStreamInfer(
        iter(requests * 2), metadata=(("triton_grpc_error", "true"),), timeout=30
    )
    answers = []
    with pytest.raises(grpc.RpcError) as caught:
        answers.extend(call)
    assert caught.value.code() == grpc.StatusCode.NOT_FOUND
    assert "unknown model 'nope'" in caught.value.details()
    assert len(answers) == 1 and not answers[0].error_message


@pytest.mark.slow
def test_a_message_above_the_limit_ends_the_call(server: ServedFaces) -> None:
    """As a ModelInfer call's: grpcio refuses it before the service sees it."""
    call = server.stub().ModelStreamInfer(iter([raw_request(DIGITS[:1]), TOO_LARGE()]))
    answers = []
    with pytest.raises(grpc.RpcError) as caught:
        answers.extend(call)
    assert caught.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert "larger than max" in caught.value.details()
    assert len(answers) <= 1
    assert len(server.stub().ModelInfer(raw_request(DIGITS[:1])).outputs) == 2


@pytest.mark.slow
def test_tritonclient_streams(server: ServedFaces) -> None:
    """tritonclient's start_stream / async_stream_infer, unmodified."""
    import tritonclient.grpc as grpcclient

    client = grpcclient.InferenceServerClient(server.address)
    answers: queue.Queue = queue.Queue()
    client.start_stream(callback=lambda result, error: answers.put((result, error)))
    x = grpcclient.InferInput("input", [1, 64], "FP32")
    x.set_data_from_numpy(DIGITS[:1])
    for i in range(20):
        client.async_stream_infer("digits-mlp" if i != 7 else "nope", [x], request_id=str(i))
    got = [answers.get(timeout=30) for _ in range(20)]
    client.stop_stream()
    assert [r.get_response().id for r, _ in got if r is not None] == [
        str(i) for i in range(20) if i != 7
    ]
    assert got[7][0] is None and "unknown model 'nope'" in str(got[7][1])


@pytest.mark.slow
def test_requests_of_one_stream_share_a_run(model_repository: Path) -> None:
    """With batches on a worker thread and a 300 ms queue delay, eight requests sent at once on
    one stream run as one batch of eight, as eight calls at once do."""
    env = {"GELU_INLINE_MAX_US": "0", "GELU_MAX_QUEUE_DELAY_US": "300000"}
    with grpc_server(model_repository, **env) as server:
        requests = [raw_request(DIGITS[:1])] * 8
        stream = (list, (server.stub().ModelStreamInfer(iter(requests), timeout=30),))
        assert runs_of_digits_mlp(server, stream) == [8, 1, 8]


@pytest.mark.slow
def test_a_client_that_stops_reading_holds_only_the_window(server: ServedFaces) -> None:
    """A client sending without end and reading nothing: the server stops reading once its
    answers fill the transport's windows and the stream's own (STREAM_WINDOW), instead of
    running every request and holding its answer; meanwhile it serves others, and once the
    client cancels, the stream's requests are let go."""
    stub, pulled = server.stub(), itertools.count()
    big = raw_request(DIGITS[:1].repeat(256, axis=0))  # 64 KiB each way and back 20 KiB

    def without_end() -> Iterator[pb.ModelInferRequest]:
        while True:
            next(pulled)
            yield big

    call = stub.ModelStreamInfer(without_end(), timeout=120)
    next(call)
    counts: list[int] = []

    def settled() -> bool:  # two seconds without a request run: five readings alike
        counts.append(_inferences(server))
        return len(counts) >= 5 and len(set(counts[-5:])) == 1

    wait_until(settled, timeout=60, every=0.5, what="the server kept reading")
    assert len(stub.ModelInfer(raw_request(DIGITS[:1])).outputs) == 2  # serving others
    sent = next(pulled)
    time.sleep(1)
    assert next(pulled) == sent + 1  # the client's sends are held too
    call.cancel()
    assert len(stub.ModelInfer(raw_request(DIGITS[:1])).outputs) == 2


def _inferences(server: ServedFaces) -> int:
    stats = server.stub().ModelStatistics(pb.ModelStatisticsRequest(name="digits-mlp"))
    return sum(s.inference_count for s in stats.model_stats)


def test_the_window_holds_requests_up_to_its_count_and_bytes() -> None:
    async def main() -> None:
        window = Window(2, 100)
        await window.take(10)
        await window.take(10)
        third = asyncio.ensure_future(window.take(10))
        await asyncio.sleep(0.01)
        assert not third.done()  # two requests held: the count is full
        window.give(10)
        await asyncio.wait_for(third, 1)
        window.give(10)
        window.give(10)
        await window.take(60)
        larger = asyncio.ensure_future(window.take(50))
        await asyncio.sleep(0.01)
        assert not larger.done()  # 110 bytes would be held
        window.give(60)
        await asyncio.wait_for(larger, 1)
        window.give(50)
        await asyncio.wait_for(window.take(500), 1)  # alone, any request fits

    asyncio.run(main())


def test_readme_quotes_the_window() -> None:
    docs = Path(__file__).resolve().parents[3] / "docs"
    readme = (docs / "endpoints.md").read_text() + (docs / "serving.md").read_text()
    assert f"answers it has written than {STREAM_WINDOW} requests" in readme
    assert f"no further ahead of its answers than {STREAM_WINDOW} requests" in readme
