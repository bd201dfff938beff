"""Service settings: every one from a ``GELU_`` environment variable (pydantic-settings)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

from pydantic import Field, field_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

# Short names accepted in GELU_PROVIDERS, and the onnxruntime execution providers they mean.
PROVIDER_NAMES = {
    "cpu": "CPUExecutionProvider",
    "cuda": "CUDAExecutionProvider",
    "tensorrt": "TensorrtExecutionProvider",
}
MIB = 1 << 20


class Settings(BaseSettings):
    """Configuration of one service process. Invalid values stop the service at start-up."""

    model_config = SettingsConfigDict(env_prefix="GELU_", protected_namespaces=())

    model_repository: Path = Field(
        Path("model_repository"),
        description="Root of the Triton-layout model repository: <model>/<version>/model.onnx.",
    )
    providers: Annotated[list[str], NoDecode] = Field(
        ["cpu"],
        description="Execution providers in order of preference, comma-separated: cpu, cuda, "
        "tensorrt (for example 'cuda,cpu').",
    )
    strict_providers: bool = Field(
        False,
        description="Refuse to start when onnxruntime falls back from a requested provider "
        "(for example CUDA that cannot load) instead of only logging it.",
    )
    intra_op_threads: int = Field(
        0, ge=0, description="onnxruntime intra-op threads per session (0: onnxruntime decides)."
    )
    inter_op_threads: int = Field(
        0, ge=0, description="onnxruntime inter-op threads per session (0: onnxruntime decides)."
    )
    max_body_bytes: int = Field(
        64 * MIB, gt=0, description="Largest request body accepted; larger ones get 413."
    )
    max_request_batch: int = Field(
        0,
        ge=0,
        description="Largest batch per request; 0 uses each model's config.pbtxt max_batch_size.",
    )
    max_activation_elements: int = Field(
        16 * MIB,
        gt=0,
        description="Largest array accepted by the activation endpoint, in elements.",
    )
    batching: bool = Field(
        True,
        description="Dynamic batching for models whose config.pbtxt has a dynamic_batching "
        "block; false turns it off everywhere.",
    )
    batch_max_size: int | None = Field(
        None,
        gt=0,
        description="Samples per batched run for every model; unset uses each config.pbtxt "
        "max_batch_size.",
    )
    max_queue_delay_us: int | None = Field(
        None,
        ge=0,
        description="How long a batch waits for more requests, in microseconds, for every "
        "model; unset uses each config.pbtxt max_queue_delay_microseconds.",
    )
    warmup_runs: int = Field(
        2, ge=0, description="Inference runs per model at start-up, before readiness turns true."
    )
    log_level: str = Field("info", description="Python log level of the service's logger.")

    @field_validator("providers", mode="before")
    @classmethod
    def _split_providers(cls, value: object) -> object:
        if isinstance(value, str):
            return [part.strip().lower() for part in value.split(",") if part.strip()]
        return value

    @field_validator("providers")
    @classmethod
    def _known_providers(cls, value: list[str]) -> list[str]:
        unknown = [p for p in value if p not in PROVIDER_NAMES]
        if unknown or not value:
            raise ValueError(
                f"unknown execution provider(s) {unknown or value}; "
                f"choose from: {', '.join(PROVIDER_NAMES)}"
            )
        return value

    @property
    def ort_providers(self) -> list[str]:
        """The onnxruntime provider names, in order of preference."""
        return [PROVIDER_NAMES[p] for p in self.providers]
