"""The service's exceptions: one base carrying its HTTP status, one handler, one body shape.

Every error response is ``{"error": "..."}``, as the Open Inference Protocol requires.
"""

from __future__ import annotations

# A request whose client went away before its answer is counted with nginx's 499, Client Closed
# Request, on every face.
CLIENT_CLOSED_REQUEST = 499
# A request whose body (gRPC: its one message) did not arrive within GELU_BODY_TIMEOUT_SECONDS.
REQUEST_TIMEOUT = 408


def first_line(exc: BaseException) -> str:
    """What a library's exception says, on one line (its type's name if it says nothing)."""
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


class ServiceError(Exception):
    """Base of every error the service answers with; ``status_code`` is the HTTP status."""

    status_code = 500

    def __init__(self, message: str, headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.headers = headers  # sent with the error (Allow, Retry-After)


class BadInputError(ServiceError):
    """The client sent something malformed or that does not fit the model."""

    status_code = 400


class LoadFailedError(BadInputError):
    """A model that could not be loaded, as Triton answers a failed load: 400, "failed to
    load". Its reason names the model's files from the repository's root, never where the
    repository lies on disk (issue 62, item 9)."""

    def __init__(self, name: str, reason: str) -> None:
        super().__init__(f"failed to load {name!r}: {reason}")


class NotFoundError(ServiceError):
    """Unknown model, version or activation."""

    status_code = 404


class MethodNotAllowedError(ServiceError):
    """A method the route does not serve; the ``Allow`` header names those it does."""

    status_code = 405

    def __init__(self, message: str, allow: str) -> None:
        super().__init__(message, {"Allow": allow})


class UnauthorizedError(ServiceError):
    """A restricted operation without the right credentials."""

    status_code = 401


class ForbiddenError(ServiceError):
    """Credentials that are valid, but not for this operation."""

    status_code = 403


class PayloadTooLargeError(ServiceError):
    """The body, batch or array is above a configured maximum."""

    status_code = 413


class RequestTimeoutError(ServiceError):
    """A request body that did not arrive within GELU_BODY_TIMEOUT_SECONDS."""

    status_code = REQUEST_TIMEOUT


class UnsupportedMediaError(ServiceError):
    """A body in an encoding or media type the service does not read."""

    status_code = 415


class NotReadyError(ServiceError):
    """The service or model is not ready to serve."""

    status_code = 503


class OverloadedError(NotReadyError):
    """The request cannot be served in time: the model's queue is full, or the request's
    deadline passed while it queued. ``Retry-After`` says when to try again (Triton answers
    both with UNAVAILABLE)."""

    def __init__(self, message: str, retry_after_s: int = 1) -> None:
        super().__init__(message, {"Retry-After": str(retry_after_s)})


class DeadlineExceededError(ServiceError):
    """A request still waiting to run when its client's own deadline (a gRPC call's) passed:
    nobody waits for its answer any more. gRPC's DEADLINE_EXCEEDED (504 where it is counted
    as HTTP)."""

    status_code = 504


class StartupError(RuntimeError):
    """The service cannot start as configured (bad repository, provider refused)."""


class ModelLoadError(RuntimeError):
    """A model or version that cannot be served (unreadable config, corrupt or mismatched
    ONNX file, a refused provider); the message names it and says why. The repository turns
    every error of a load into this one (issue 62, item 3); the faces answer it as
    ``LoadFailedError``."""
