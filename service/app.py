"""The app factory: ``uvicorn --factory service.app:create_app``.

Nothing is built at import time. The lifespan loads every model version and the activation
graphs, checks and warms them, and only then does the app accept requests and report ready.
"""

from __future__ import annotations

import gc
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import anyio.to_thread
from fastapi import FastAPI, Request, Response
from fastapi.exceptions import RequestValidationError
from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect

from service import __version__, codecs
from service.activations import ActivationEvaluator
from service.dataplane import DataPlane
from service.errors import PayloadTooLargeError, ServiceError, StartupError
from service.metrics import ASGIApp, Message, Metrics, MetricsMiddleware, Receive, Scope, Send
from service.openapi import add_openapi
from service.routes import activations, v1, v2
from service.runtime import ModelRepository, SessionFactory, session_options
from service.settings import Settings, load_settings

logger = logging.getLogger("gelu_serve")


class BodyLimitMiddleware:
    """413 for a body above ``max_bytes``: by its Content-Length, or as it streams in."""

    def __init__(self, app: ASGIApp, max_bytes: int) -> None:
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        for key, value in scope["headers"]:
            if key == b"content-length" and value.isdigit() and int(value) > self.max_bytes:
                await _send_error(send, PayloadTooLargeError(self._message(int(value))))
                return
        received = 0

        async def limited_receive() -> Message:
            nonlocal received
            message = await receive()
            received += len(message.get("body", b""))
            if received > self.max_bytes:
                raise PayloadTooLargeError(self._message(received))
            return message

        await self.app(scope, limited_receive, send)

    def _message(self, size: int) -> str:
        return (
            f"body of {size} bytes is above the maximum of {self.max_bytes} (GELU_MAX_BODY_BYTES)"
        )


class StartupRefusal:
    """A start-up refusal is one log line, not a traceback (pure ASGI, lifespan scope only).

    Starlette answers a failed lifespan with the exception's full traceback, which uvicorn logs.
    The lifespan has already logged a ``StartupError`` as one line naming what is at fault, so
    uvicorn is told only that start-up failed; any other exception keeps its traceback.
    """

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "lifespan":
            await self.app(scope, receive, send)
            return
        failed: Message | None = None

        async def hold_failure(message: Message) -> None:
            nonlocal failed
            if message["type"] == "lifespan.startup.failed":
                failed = message  # sent below, once we know which exception it was
                return
            await send(message)

        try:
            await self.app(scope, receive, hold_failure)
        except StartupError:
            await send({"type": "lifespan.startup.failed", "message": ""})
            raise
        except BaseException:
            if failed is not None:
                await send(failed)
            raise


def _error_body(message: str) -> bytes:
    return codecs.dumps({"error": message})


async def _send_error(send: Send, error: ServiceError) -> None:
    body = _error_body(error.message)
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    await send({"type": "http.response.start", "status": error.status_code, "headers": headers})
    await send({"type": "http.response.body", "body": body})


async def handle_error(request: Request, exc: Exception) -> Response:
    """The one error handler: every error body is ``{"error": "..."}``."""
    if isinstance(exc, ServiceError):
        status, message = exc.status_code, exc.message
    elif isinstance(exc, RequestValidationError):
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first.get("loc", ()))
        status, message = 400, f"{where}: {first.get('msg', 'invalid')}"
    elif isinstance(exc, HTTPException):
        status, message = exc.status_code, str(exc.detail)
    elif isinstance(exc, ClientDisconnect):  # nobody is left to answer; not our failure
        status, message = 400, "client disconnected before the body was complete"
    else:
        logger.exception("unhandled error on %s %s", request.method, request.url.path)
        status, message = 500, "internal server error"
    return Response(_error_body(message), status_code=status, media_type="application/json")


def create_app(settings: Settings | None = None) -> FastAPI:
    """Build the app; its lifespan loads the repository named by ``settings``."""
    settings = settings or load_settings()
    logging.basicConfig(format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logger.setLevel(settings.log_level.upper())
    metrics = Metrics(multiprocess=settings.prometheus_multiproc_dir is not None)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        options = session_options(settings.intra_op_threads, settings.inter_op_threads)
        sessions = SessionFactory(settings.ort_providers, options, settings.strict_providers)
        try:
            repository = await anyio.to_thread.run_sync(
                ModelRepository.load, settings.model_repository, sessions, settings.warmup_runs
            )
            evaluator = ActivationEvaluator(sessions)
        except StartupError as exc:
            # One line names what is at fault; the traceback only helps at debug level.
            logger.error("cannot start: %s", exc, exc_info=logger.isEnabledFor(logging.DEBUG))
            raise
        dataplane = DataPlane(settings, repository, evaluator, metrics)
        await dataplane.start()
        app.state.dataplane = dataplane
        # What start-up allocated lives as long as the process: keep the collector off it, so
        # collections under load scan only the requests' own objects (shorter GC pauses).
        gc.collect()
        gc.freeze()
        logger.info(
            "ready: %d model version(s) from %s, %d batching",
            len(repository.all()),
            settings.model_repository,
            len(dataplane.batchers),
        )
        yield
        await dataplane.stop()

    app = FastAPI(
        title="gelu-serve",
        version=__version__,
        description="GELU networks served by onnxruntime: KServe V1 predictions, the Open "
        "Inference Protocol (V2) and raw activation evaluation.",
        lifespan=lifespan,
        docs_url=None,
        redoc_url=None,
    )
    add_openapi(app)
    app.include_router(v1.router)
    app.include_router(v2.router)
    app.include_router(activations.router)

    @app.get(
        "/metrics",
        tags=["Operations"],
        response_class=Response,
        responses={200: {"content": {"text/plain": {"schema": {"type": "string"}}}}},
    )
    async def prometheus_metrics() -> Response:
        """Prometheus text format: requests, failures, latency, in-flight, providers, batches."""
        return Response(metrics.exposition(), media_type="text/plain; version=0.0.4")

    for exc_class in (
        ServiceError,
        RequestValidationError,
        HTTPException,
        ClientDisconnect,
        Exception,
    ):
        app.add_exception_handler(exc_class, handle_error)
    app.add_middleware(BodyLimitMiddleware, max_bytes=settings.max_body_bytes)
    app.add_middleware(MetricsMiddleware, metrics=metrics)
    app.add_middleware(StartupRefusal)
    return app
