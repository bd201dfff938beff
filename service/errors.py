"""The service's exceptions: one base carrying its HTTP status, one handler, one body shape.

Every error response is ``{"error": "..."}``, as the Open Inference Protocol requires.
"""

from __future__ import annotations


class ServiceError(Exception):
    """Base of every error the service answers with; ``status_code`` is the HTTP status."""

    status_code = 500

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class BadInputError(ServiceError):
    """The client sent something malformed or that does not fit the model."""

    status_code = 400


class NotFoundError(ServiceError):
    """Unknown model, version or activation."""

    status_code = 404


class UnauthorizedError(ServiceError):
    """A restricted operation without the right credentials."""

    status_code = 401


class PayloadTooLargeError(ServiceError):
    """The body, batch or array is above a configured maximum."""

    status_code = 413


class NotReadyError(ServiceError):
    """The service or model is not ready to serve."""

    status_code = 503


class StartupError(RuntimeError):
    """The service cannot start as configured (bad repository, provider refused)."""


class ModelLoadError(RuntimeError):
    """A model or version that cannot be served (unreadable config, corrupt or mismatched
    ONNX file, a refused provider); the message names it and says why."""
