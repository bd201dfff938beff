"""The service's logs: request ids, text or JSON lines, an access log for both faces, and
Triton's logging extension (``/v2/logging``, gRPC ``LogSettings``) changing them at run time.

Everything is logged on the one ``gelu_serve`` logger, so its filter sees every record: it
drops the severities Triton's settings turn off and stamps each record with the id of the
request being served (a context variable the faces set), which both formats write.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import logging
import re
import time
from contextvars import ContextVar
from random import getrandbits
from typing import Any

from service.errors import BadInputError

logger = logging.getLogger("gelu_serve")
REQUEST_ID_HEADER = "x-request-id"
MAX_REQUEST_ID = 128
# The request being served, for every record logged while serving it.
request_id: ContextVar[str | None] = ContextVar("gelu_request_id", default=None)
FORMATS = ("default", "ISO8601", "json")  # Triton's two, and one object per line
TEXT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
# The fields a record may carry (``extra=``) that the JSON format writes, in this order.
FIELDS = ("request_id", "model", "version", "method", "path", "status", "duration_ms")


# A fresh id is this process's random prefix and a count: unique, not secret, and cheap.
_FORMAT = format(getrandbits(32), "08x") + "%08x"
_COUNT = itertools.count(getrandbits(16))


def new_request_id() -> str:
    """A fresh request id: 16 hex digits, this process's random 8 and a count."""
    return _FORMAT % (next(_COUNT) & 0xFFFFFFFF)


def checked_request_id(given: str | None) -> str:
    """The caller's request id, or a fresh one when it sent none; ``BadInputError`` for one
    that could not be written safely into a log line or a header."""
    if given is None:
        return new_request_id()
    if not 0 < len(given) <= MAX_REQUEST_ID or not given.isprintable() or " " in given:
        raise BadInputError(
            f"X-Request-ID must be 1-{MAX_REQUEST_ID} visible characters without spaces"
        )
    return given


def adopt_request_id(given: str) -> None:
    """Serve the rest of the request under ``given`` (a V2 request's own ``id``, when no
    X-Request-ID came), if it can be written safely."""
    # An unsafe one: the body keeps its id, the request the one it has.
    with contextlib.suppress(BadInputError):
        request_id.set(checked_request_id(given))


class JsonFormatter(logging.Formatter):
    """One JSON object per line: time (UTC, ISO 8601), level, logger, message, and the
    request's fields where the record has them."""

    def format(self, record: logging.LogRecord) -> str:
        when = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
        line: dict[str, Any] = {
            "time": f"{when}.{int(record.msecs):03d}Z",
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        for name in FIELDS:
            value = getattr(record, name, None)
            if value is not None:
                line[name] = value
        if record.exc_info:
            line["exception"] = self.formatException(record.exc_info)
        return json.dumps(line, separators=(",", ":"))


class IsoFormatter(logging.Formatter):
    """The text format with ISO 8601 UTC times (Triton's ``log_format: ISO8601``)."""

    converter = time.gmtime  # type: ignore[assignment]  # typeshed types it without its argument

    def __init__(self) -> None:
        super().__init__(TEXT, "%Y-%m-%dT%H:%M:%SZ")


def formatter(kind: str) -> logging.Formatter:
    """The formatter for ``log_format`` ``kind``."""
    if kind == "json":
        return JsonFormatter()
    if kind == "ISO8601":
        return IsoFormatter()
    return logging.Formatter(TEXT)


MAX_VERBOSE = 2**32 - 1  # log_verbose_level's largest, a uint32 as Triton's


class LogControl(logging.Filter):
    """Triton's log settings, applied to the ``gelu_serve`` logger: a filter that drops the
    severities turned off and stamps each record with its request id. Logging is the
    process's, so there is one (``LOGS``), which each app configures from its settings."""

    def __init__(self, level: str = "info", log_format: str = "default") -> None:
        super().__init__()
        self.configure(level, log_format)

    verbose = False  # DEBUG lines are logged: an access line per request

    def configure(self, level: str, log_format: str) -> LogControl:
        """Back to the settings' level and format, every severity on; this control."""
        self.base_level = logging.getLevelName(level.upper())
        self.values: dict[str, Any] = {
            "log_file": "",
            "log_info": True,
            "log_warning": True,
            "log_error": True,
            "log_verbose_level": 0,
            "log_format": log_format,
        }
        return self

    def filter(self, record: logging.LogRecord) -> bool:
        values = self.values
        if record.levelno >= logging.ERROR:
            allowed = values["log_error"]
        elif record.levelno >= logging.WARNING:
            allowed = values["log_warning"]
        elif record.levelno >= logging.INFO:
            allowed = values["log_info"]
        else:
            allowed = values["log_verbose_level"] > 0
        if allowed and getattr(record, "request_id", None) is None:
            record.request_id = request_id.get()
        return bool(allowed)

    def install(self) -> None:
        """Handlers on the root logger (as ``logging.basicConfig``), this filter on
        ``gelu_serve``, and the settings' level and format applied."""
        logging.basicConfig(format=TEXT)
        if self not in logger.filters:
            logger.addFilter(self)
        self.apply()

    def apply(self) -> None:
        verbose = self.values["log_verbose_level"] > 0
        logger.setLevel(logging.DEBUG if verbose else self.base_level)
        # Read per request (``wants_access``): an attribute, not the logger's level lookup.
        self.verbose = logger.isEnabledFor(logging.DEBUG)
        chosen = formatter(self.values["log_format"])
        for handler in logging.getLogger().handlers:
            if type(handler) is logging.StreamHandler:  # ours; a test's capture keeps its own
                handler.setFormatter(chosen)

    def settings(self) -> dict[str, Any]:
        """Triton's ``/v2/logging`` answer."""
        return dict(self.values)

    def update(self, changes: dict[str, Any]) -> dict[str, Any]:
        """Apply Triton's settings ``changes`` (all checked before any is applied); the
        settings now. ``BadInputError`` names the first that cannot be."""
        checked = {}
        for name, value in changes.items():
            if name not in self.values:
                raise BadInputError(
                    f"unknown log setting {name!r}; known: {', '.join(self.values)}"
                )
            checked[name] = self._checked(name, value)
        self.values.update(checked)
        self.apply()
        logger.info("log settings now %s", self.values)
        return self.settings()

    @staticmethod
    def _checked(name: str, value: Any) -> Any:
        if name == "log_file":
            if value not in ("", None):
                raise BadInputError("log_file: logs go to standard error; it cannot be set")
            return ""
        if name == "log_format":
            if value not in FORMATS:
                raise BadInputError(f"log_format must be one of {', '.join(FORMATS)}")
            return value
        if name == "log_verbose_level":
            # Triton's type is uint32: a larger level set over HTTP made every later gRPC
            # LogSettings answer INTERNAL (its uint32_param refused the value).
            if type(value) is not int or not 0 <= value <= MAX_VERBOSE:  # type(): not a bool
                raise BadInputError(
                    f"log_verbose_level must be a non-negative integer <= {MAX_VERBOSE}"
                )
            return value
        if not isinstance(value, bool):
            raise BadInputError(f"{name} must be true or false")
        return value


def wants_access(access_log: bool) -> bool:
    """Whether a request is logged: always under GELU_ACCESS_LOG, else at verbose levels."""
    return access_log or LOGS.verbose


LOGS = LogControl()


# What a client-given field may not carry into a log line as it is: the C0 controls (CR and
# LF among them), DEL, the C1 controls (NEL among them), the Unicode line and paragraph
# separators, and the double quote and backslash that would end or fake an escape or a quoted
# field.
_UNSAFE = re.compile(r'[\x00-\x1f\x7f-\x9f"\\\u2028\u2029]')


def _escaped(found: re.Match[str]) -> str:
    code = ord(found.group())
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def escape(text: str) -> str:
    """``text`` as a log line may carry it: each unsafe character written ``\\xHH`` (as
    nginx writes them; ``\\uHHHH`` above U+00FF), so that a ``%0A`` in a path or a raw byte
    can neither split a line nor forge one (issue 62, item 11). ``text`` itself when it has
    none: one scan, nothing allocated."""
    if _UNSAFE.search(text) is None:
        return text
    return _UNSAFE.sub(_escaped, text)


def access(
    face: str,
    method: str,
    path: str,
    status: int | str,
    seconds: float,
    access_log: bool,
    **fields: Any,
) -> None:
    """One access log line, the same fields on both faces: at INFO under GELU_ACCESS_LOG,
    else at DEBUG (``log_verbose_level`` 1 and up). The client's strings (method, path, the
    fields') are ``escape``d, in the line and in the fields the JSON format writes."""
    method, path = escape(method), escape(path)
    for name, value in fields.items():
        if isinstance(value, str):
            fields[name] = escape(value)
    duration_ms = round(seconds * 1000, 3)
    logger.log(
        logging.INFO if access_log else logging.DEBUG,
        "%s %s %s %s %.3f ms",
        face,
        method,
        path,
        status,
        duration_ms,
        extra={"method": method, "path": path, "status": status, "duration_ms": duration_ms,
               **fields},
    )  # fmt: skip
