"""What a face hands the serving core and gets back: arrays and options, no wire format.

Codecs (``service.codecs``) turn V1 JSON, V2 JSON and V2 binary into an ``InferenceRequest``;
the core (``service.dataplane``) checks it against the model, runs it and returns an
``InferenceResult``, which the codec of the same face encodes.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from contract.model_config import SchedulingPolicy
from service.settings import PROVIDER_NAMES

# The per-request types are plain slotted dataclasses: frozen ones cost more to build, on every
# request (docs/performance.md, "The batcher's constants, and other measured choices").


@dataclass(slots=True)
class RequestInput:
    """One input tensor as the client sent it.

    ``name`` and ``datatype`` are None where the protocol does not name them (V1's
    ``instances`` are the model's only input, in its datatype: the core casts them).
    """

    array: np.ndarray
    name: str | None = None
    datatype: str | None = None

    def describe(self) -> str:
        """How error messages refer to this input."""
        return f"input {self.name!r}" if self.name is not None else "instances"


@dataclass(slots=True)
class RequestOutput:
    """One output the client asked for, whether it wants it as raw bytes, and whether it wants
    only the top ``class_count`` classes (Triton's classification extension; 0: the tensor)."""

    name: str
    binary: bool = False
    class_count: int = 0


@dataclass(slots=True)
class InferenceRequest:
    """A decoded request: ``outputs`` None means every output, as ``binary_outputs`` says;
    ``timeout_us`` is how long it may wait in a queue and ``priority`` its priority level
    (Triton's ``timeout`` and ``priority`` parameters, its schedule policy extension);
    ``client_deadline_ns`` when its client stops waiting for the answer (a gRPC deadline, as
    ``time.perf_counter_ns``)."""

    inputs: list[RequestInput]
    outputs: list[RequestOutput] | None = None
    binary_outputs: bool = False
    id: str | None = None
    timeout_us: int | None = None
    trace: Any = None  # a traced request's ``service.tracing.RequestTrace``; None untraced
    priority: int = 0  # 0: the model's default level
    client_deadline_ns: int | None = None


@dataclass(frozen=True)
class TensorInfo:
    """A model's input or output: name, V2 datatype, dims without the batch dimension."""

    name: str
    datatype: str
    dims: tuple[int, ...]

    def metadata(self, batch: list[int]) -> dict[str, Any]:
        """The tensor as model metadata describes it, ``batch`` (``[-1]`` or ``[]``) first."""
        return {"name": self.name, "datatype": self.datatype, "shape": [*batch, *self.dims]}


@dataclass(frozen=True)
class ModelInfo:
    """Plain data about one loaded model version: what faces describe and encode with."""

    name: str
    version: str
    versions: list[str]  # every loaded version of the model
    platform: str
    task: str
    arch: str
    activation: str
    label_names: tuple[str, ...]
    inputs: list[TensorInfo]
    outputs: list[TensorInfo]
    input_normalisation: dict[str, float]
    metrics: dict[str, float]
    max_batch_size: int  # the largest batch one request may carry
    providers: list[str]
    provider_options: dict[str, dict[str, str]]  # each provider's options in force
    instance_count: int  # config.pbtxt's instance_group counts, summed
    memory_bytes: int  # what opening its session took of the process's memory, measured
    dynamic_batching: bool
    max_queue_delay_us: int | None
    config_max_batch_size: int = 0  # config.pbtxt's own value
    # An ensemble's steps as Triton's model configuration JSON has them ([] for a model).
    ensemble_steps: list[dict[str, Any]] = field(default_factory=list)
    cuda_graphs: tuple[int, ...] = ()  # optimization.cuda.graphs' batch sizes, when asked
    scheduling: SchedulingPolicy | None = None  # dynamic_batching's priority levels and queues
    batch_invariant: str = ""  # config.pbtxt's parameters batch_invariant: "rows", "pad", "" off

    def configuration(self) -> dict[str, Any]:
        """This version's config.pbtxt as Triton's model configuration JSON."""
        config: dict[str, Any] = {
            "name": self.name,
            "platform": self.platform,
            "max_batch_size": self.config_max_batch_size,
            "input": [{"name": t.name, "data_type": f"TYPE_{t.datatype}", "dims": t.dims}
                      for t in self.inputs],
            "output": [{"name": t.name, "data_type": f"TYPE_{t.datatype}", "dims": t.dims}
                       for t in self.outputs],
        }  # fmt: skip
        if self.dynamic_batching:
            batching = {"max_queue_delay_microseconds": self.max_queue_delay_us}
            if self.scheduling is not None:
                batching.update(self.scheduling.to_json())
            config["dynamic_batching"] = batching
        if self.batch_invariant:  # Triton's model parameters, as its JSON writes them
            config["parameters"] = {"batch_invariant": {"string_value": self.batch_invariant}}
        if self.ensemble_steps:  # Triton's: no instance of its own, its steps
            config["ensemble_scheduling"] = {"step": self.ensemble_steps}
            return config
        cuda = self.provider_options.get(PROVIDER_NAMES["cuda"])
        config["instance_group"] = [instance_group(self, cuda)]
        if cuda is not None:
            # Triton's place for the CUDA provider's options (its onnxruntime backend's).
            accelerator = {"name": "cuda", "parameters": cuda}
            config["optimization"] = {
                "execution_accelerators": {"gpu_execution_accelerator": [accelerator]}
            }
            if self.cuda_graphs:  # in force only on CUDA
                specs = [{"batch_size": b} for b in self.cuda_graphs]
                config["optimization"]["cuda"] = {"graphs": True, "graph_spec": specs}
        return config

    def metadata(self, one_version: bool = False) -> dict[str, Any]:
        """The Open Inference Protocol's model metadata, as every face reports it: the model's
        versions (only this one's when ``one_version``), platform and tensors. A model that
        batches (``max_batch_size`` > 0) has -1 for the batch dimension first; one that does
        not has its dims as config.pbtxt declares them, as Triton reports both."""
        batch = [-1] if self.config_max_batch_size else []
        return {
            "name": self.name,
            "versions": [self.version] if one_version else self.versions,
            "platform": self.platform,
            "inputs": [t.metadata(batch) for t in self.inputs],
            "outputs": [t.metadata(batch) for t in self.outputs],
        }


@dataclass(slots=True)
class InferenceResult:
    """The requested outputs, in the order asked for, and the model that made them."""

    model: ModelInfo
    outputs: dict[str, np.ndarray]
    binary: dict[str, bool] = field(default_factory=dict)  # output name -> as raw bytes
    binary_default: bool = False  # for an output ``binary`` does not name
    inputs: dict[str, np.ndarray] = field(default_factory=dict)  # as validated
    id: str | None = None
    answerer: Any = None  # the loaded version (``service.runtime.Model``) that answered

    def as_binary(self, name: str) -> bool:
        """Whether output ``name`` is asked for as raw bytes."""
        return self.binary.get(name, self.binary_default)


def instance_group(info: ModelInfo, cuda: dict[str, str] | None) -> dict[str, Any]:
    """Triton's ``instance_group`` for a version: on the GPU its session's CUDA provider
    (whose options in force are ``cuda``) runs on, or on the CPU."""
    if cuda is None:
        return {"kind": "KIND_CPU", "count": info.instance_count}
    return {"kind": "KIND_GPU", "count": info.instance_count, "gpus": [int(cuda["device_id"])]}
