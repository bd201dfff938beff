"""Triton's ensembles (``platform: "ensemble"``): models run in turn, each step's inputs taken
from the ensemble's inputs or an earlier step's outputs, as ``ensemble_scheduling`` maps them.

An ensemble version is a ``Model`` whose session runs nothing (``EnsembleSession``): the core
checks a request against the ensemble's own inputs and outputs, then ``run`` sends each step
through the core as a request of its own, so each step model is batched by its own batcher,
counted in its own statistics, and answers exactly as it does when called directly.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import numpy as np

from contract.model_config import V2_TO_NUMPY, ModelConfig
from contract.names import CONFIG_FILENAME, ENSEMBLE_PLATFORM
from service.errors import ModelLoadError
from service.inference import InferenceRequest, InferenceResult, RequestInput, RequestOutput
from service.runtime import TensorSpec

Infer = Callable[[str, str | None, InferenceRequest], Awaitable[InferenceResult]]
NUMPY_TO_V2 = {dtype: v2 for v2, dtype in V2_TO_NUMPY.items()}


class EnsembleSession:
    """The ``Session`` of an ensemble: its tensors as its config declares them, no runs."""

    def __init__(self, config: ModelConfig) -> None:
        batch = (-1,) if config.max_batch_size else ()
        self.inputs = [TensorSpec(t.name, t.datatype, (*batch, *t.dims)) for t in config.inputs]
        self.outputs = [TensorSpec(t.name, t.datatype, (*batch, *t.dims)) for t in config.outputs]
        self.providers: list[str] = []
        self.provider_options: dict[str, dict[str, str]] = {}
        self.metadata_props: dict[str, str] = {}
        self.memory_bytes = 0

    def run(self, names: list[str], feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
        raise ModelLoadError("an ensemble runs its steps, not a session")

    def close(self) -> None:
        pass


def check_steps(config: ModelConfig, root: Path, read: Callable[[Path], ModelConfig]) -> None:
    """``ModelLoadError`` unless every step names a model of the repository at ``root`` (not
    an ensemble), feeds each of its inputs from a tensor that exists by then and maps only
    outputs it has, each tensor in the datatype the model takes, and every output of the
    ensemble is made by a step."""
    label = f"{config.name}: ensemble_scheduling"
    if not config.steps:
        raise ModelLoadError(f"{label}: an ensemble needs at least one step")
    known = {t.name: t.datatype for t in config.inputs}  # the tensors so far, and datatypes
    for number, step in enumerate(config.steps, 1):
        where = f"{label} step {number} ({step.model_name!r})"
        model_dir = root / step.model_name
        if not (model_dir / CONFIG_FILENAME).is_file() or step.model_name == config.name:
            raise ModelLoadError(f"{where}: no such model with a config.pbtxt in the repository")
        step_config = read(model_dir)
        if step_config.platform == ENSEMBLE_PLATFORM:
            raise ModelLoadError(f"{where}: a step may not be an ensemble")
        inputs = {t.name: t.datatype for t in step_config.inputs}
        outputs = {t.name: t.datatype for t in step_config.outputs}
        fed = {key for key, _ in step.input_map}
        if fed != set(inputs):
            raise ModelLoadError(f"{where}: input_map feeds {sorted(fed)}, the model takes "
                                 f"{sorted(inputs)}")  # fmt: skip
        for key, value in step.input_map:
            if value not in known:
                raise ModelLoadError(f"{where}: no tensor {value!r} exists before this step")
            if known[value] != inputs[key]:
                raise ModelLoadError(f"{where}: {value!r} is {known[value]}, the model's input "
                                     f"{key!r} {inputs[key]}")  # fmt: skip
        unknown = [key for key, _ in step.output_map if key not in outputs]
        if unknown:
            raise ModelLoadError(f"{where}: the model has no output {unknown[0]!r}")
        known |= {value: outputs[key] for key, value in step.output_map}
    unmade = [t.name for t in config.outputs if t.name not in known]
    if unmade:
        raise ModelLoadError(f"{label}: no step makes the output {unmade[0]!r}")


async def run(
    config: ModelConfig, inputs: dict[str, np.ndarray], infer: Infer, given: InferenceRequest
) -> tuple[dict[str, np.ndarray], tuple[Any, ...]]:
    """The ensemble's outputs for ``inputs`` (checked against its config), and the loaded
    version (``InferenceResult.answerer``) each step ran on: each step run in turn through
    ``infer`` (the core's, so each is checked, batched and counted as a request of its own),
    with the ``given`` request's timeout, priority and client deadline, as Triton's ensemble
    passes them on. The response cache keys an ensemble's answer by its steps' versions
    (issue 62, item 8)."""
    tensors = dict(inputs)
    answerers = []
    for step in config.steps:
        request = InferenceRequest(
            [
                RequestInput(tensors[value], key, NUMPY_TO_V2[tensors[value].dtype])
                for key, value in step.input_map
            ],
            outputs=[RequestOutput(key) for key, _ in step.output_map],
            timeout_us=given.timeout_us,
            priority=given.priority,
            client_deadline_ns=given.client_deadline_ns,
        )
        version = str(step.model_version) if step.model_version > 0 else None
        result = await infer(step.model_name, version, request)
        answerers.append(result.answerer)
        tensors.update((value, result.outputs[key]) for key, value in step.output_map)
    return {t.name: tensors[t.name] for t in config.outputs}, tuple(answerers)
