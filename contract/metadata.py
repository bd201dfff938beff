"""The metadata export records in each ``model.onnx`` and the service reads back."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from typing import Any


@dataclass(frozen=True)
class ModelMetadata:
    """What export records in ``model.onnx``'s ``metadata_props`` (all values strings there).

    A model from elsewhere may carry none of it: every field has a neutral default.
    """

    name: str = ""
    version: str = ""
    arch: str = ""
    activation: str = ""
    task: str = ""
    label_names: tuple[str, ...] = ()
    # How a raw sample becomes the model's input: input = raw / divide_by.
    input_normalisation: dict[str, float] = field(default_factory=dict)
    metrics: dict[str, float] = field(default_factory=dict)  # training metrics
    dataset: str = ""
    model_config: dict[str, Any] = field(default_factory=dict)  # the network's config
    checkpoint_sha256: str = ""
    opset: str = ""
    torch_version: str = ""

    _JSON = ("label_names", "input_normalisation", "metrics", "model_config")

    def to_props(self) -> dict[str, str]:
        """``metadata_props`` entries: JSON for the structured fields."""
        return {
            key: json.dumps(list(value) if isinstance(value, tuple) else value)
            if key in self._JSON
            else str(value)
            for key, value in asdict(self).items()
        }

    @classmethod
    def from_props(cls, props: dict[str, str]) -> ModelMetadata:
        """Parse ``metadata_props``; unknown keys are ignored, missing ones default."""
        known = {f for f in cls.__dataclass_fields__ if f in props}
        values: dict[str, Any] = {}
        for key in known:
            values[key] = json.loads(props[key]) if key in cls._JSON else props[key]
        if "label_names" in values:
            values["label_names"] = tuple(values["label_names"])
        return cls(**values)
