"""Triton's trace extension: which requests are traced, changed while the service runs.

``GET/POST /v2/trace/setting`` (server-wide) and ``/v2/models/{m}/trace/setting`` (one
model's, overriding the server's field by field; ``null`` clears an override), and gRPC
``TraceSetting``. Values travel as Triton's do: strings, and ``trace_level`` a list.

- ``trace_level``: ``["OFF"]`` or ``["TIMESTAMPS"]`` (spans with each stage's times);
  ``TIMESTAMPS`` by default when ``OTEL_TRACES_EXPORTER`` names an exporter, else ``OFF``.
- ``trace_rate``: one request in every N is traced (default 1; the OpenTelemetry sampler,
  ``OTEL_TRACES_SAMPLER``, decides after it, as for any span).
- ``trace_count``: how many more traces, then none (-1: no limit).
- ``log_frequency``: Triton's trace-file flushing; spans leave in OTLP batches
  (``OTEL_BSP_*``) instead, so it is kept and reported but changes nothing here.
- ``trace_mode``: ``opentelemetry``, the only one (read only).
"""

from __future__ import annotations

from typing import Any

from service.errors import BadInputError

FIELDS = ("trace_level", "trace_rate", "trace_count", "log_frequency")
LEVELS = ("OFF", "TIMESTAMPS")


class TraceSettings:
    """The server's settings, models' overrides, and the counters that apply them."""

    def __init__(self, enabled: bool) -> None:
        self.enabled = enabled  # an exporter is configured
        level = "TIMESTAMPS" if enabled else "OFF"
        self.server: dict[str, Any] = {
            "trace_level": [level], "trace_rate": 1, "trace_count": -1, "log_frequency": 0
        }  # fmt: skip
        self.models: dict[str, dict[str, Any]] = {}  # only the repository's model names
        self._seen: dict[str, int] = {}  # requests counted towards trace_rate, by model
        self.every = enabled  # every request picked (nothing to count): pick's fast answer

    def effective(self, model: str | None = None) -> dict[str, Any]:
        """The settings in force for ``model`` (the server's, where it overrides none)."""
        return {**self.server, **self.models.get(model or "", {})}

    def reply(self, model: str | None = None) -> dict[str, Any]:
        """Triton's answer: every value a string, ``trace_level`` a list of them."""
        values = self.effective(model)
        answer: dict[str, Any] = {k: str(values[k]) for k in FIELDS if k != "trace_level"}
        return {"trace_level": list(values["trace_level"]), **answer,
                "trace_mode": "opentelemetry"}  # fmt: skip

    def update(self, changes: dict[str, Any], model: str | None = None) -> dict[str, Any]:
        """Apply ``changes`` (checked whole first) to the server's or ``model``'s settings
        (a repository model, which the caller has checked); Triton's answer."""
        checked: dict[str, Any] = {}
        for name, value in changes.items():
            if name == "trace_mode":
                if value not in (None, "opentelemetry", ["opentelemetry"]):
                    raise BadInputError("trace_mode: only opentelemetry")
                continue
            if name not in FIELDS:
                raise BadInputError(f"unknown trace setting {name!r}; known: {', '.join(FIELDS)}")
            if value is None and model is None:
                raise BadInputError(f"{name}: only a model's setting can be cleared (null)")
            checked[name] = None if value is None else self._checked(name, value)
        target = self.server if model is None else self.models.setdefault(model, {})
        for name, value in checked.items():
            if value is None:
                target.pop(name, None)
            else:
                target[name] = value
        if model is not None and not target:
            del self.models[model]
        server = self.server
        self.every = (
            not self.models
            and server["trace_level"][0] != "OFF"
            and (server["trace_rate"] == 1 and server["trace_count"] == -1)
        )
        return self.reply(model)

    def _checked(self, name: str, value: Any) -> Any:
        if name == "trace_level":
            levels = value if isinstance(value, list) else [value]
            if len(levels) != 1 or levels[0] not in LEVELS:
                raise BadInputError(
                    f"trace_level must be one of {', '.join(LEVELS)} (TENSORS is not traced here)"
                )
            if levels[0] != "OFF" and not self.enabled:
                raise BadInputError(
                    "tracing is off in this process: set OTEL_TRACES_EXPORTER (otlp or console)"
                )
            return levels
        number = value[0] if isinstance(value, list) and len(value) == 1 else value
        # An integer or its decimal string (Triton's answers are strings): int() alone read
        # true as 1 and 1.5 as 1, a client's mistake taken for a setting.
        try:
            if type(number) not in (int, str):
                raise ValueError(number)
            parsed = int(number)
        except ValueError:
            raise BadInputError(f"{name} must be an integer, got {value!r}") from None
        least = {"trace_rate": 1, "trace_count": -1, "log_frequency": 0}[name]
        if parsed < least:
            raise BadInputError(f"{name} must be at least {least}")
        return parsed

    def pick(self, model: str) -> bool:
        """Whether this request (for repository model ``model``, or "" when it names none
        the repository holds) is traced; counts it towards the rate and the count."""
        if self.every:  # the default with an exporter: one attribute read per request
            return True
        override = self.models.get(model)
        values = {**self.server, **override} if override else self.server
        if values["trace_level"][0] == "OFF":
            return False
        seen = self._seen[model] = self._seen.get(model, 0) + 1
        if seen % values["trace_rate"]:
            return False
        count = values["trace_count"]
        if count == 0:
            return False
        if count > 0:  # where the count is set, it runs down
            owner = override if override and "trace_count" in override else self.server
            owner["trace_count"] = count - 1
        return True
