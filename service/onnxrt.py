"""onnxruntime as the core's runtime (``service.runtime.Runtime``), on the execution providers
the settings name: CPU, or CUDA with the CPU behind it.

It detects a silent fallback from a requested provider (onnxruntime runs on the CPU when a
provider cannot load), logs each missing provider once and refuses under
``GELU_STRICT_PROVIDERS``. The activation graphs (``service.activations``) are opened here too.
"""

from __future__ import annotations

import itertools
import logging
import os
import warnings
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort

from contract.model_config import ONNX_TO_V2
from service.binding import BoundSession
from service.cuda import provider_unloadable
from service.errors import ModelLoadError, first_line
from service.runtime import ONE_INSTANCE, Placement, TensorSpec
from service.settings import PROVIDER_NAMES

logger = logging.getLogger("gelu_serve")
CUDA = PROVIDER_NAMES["cuda"]
PAGE_BYTES = os.sysconf("SC_PAGE_SIZE")


# onnxruntime's session config keys for whether its thread pools' threads spin for work.
SPINNING_KEYS = ("session.intra_op.allow_spinning", "session.inter_op.allow_spinning")


def session_options(
    intra_op_threads: int, inter_op_threads: int, spinning: bool = False
) -> ort.SessionOptions:
    """Session options shared by model and activation sessions. ``spinning``: the pools'
    threads spin for work between runs (onnxruntime's default) instead of sleeping; with many
    sessions on few cores, spinning takes the cores the event loop and the other models need
    (docs/performance.md, "Many models")."""
    options = ort.SessionOptions()
    options.intra_op_num_threads = intra_op_threads
    options.inter_op_num_threads = inter_op_threads
    for key in SPINNING_KEYS:
        options.add_session_config_entry(key, "1" if spinning else "0")
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    options.log_severity_level = 3  # errors only; provider fallback is reported by us
    return options


class SessionFactory:
    """Creates onnxruntime sessions on the configured providers and reports fallbacks once.

    onnxruntime silently falls back to CPU when a requested provider cannot load; compare what
    was asked for with what each session reports, log each missing provider once (not once per
    model and graph), and refuse under ``strict``.
    """

    def __init__(
        self,
        providers: list[str],
        options: ort.SessionOptions,
        strict: bool,
        provider_options: list[dict[str, str]] | None = None,
    ) -> None:
        self.providers = providers
        self.provider_options = provider_options or [{} for _ in providers]
        self.options = options
        self.strict = strict
        self._reported: set[str] = set()

    def create(
        self, source: str | bytes, label: str, cuda: dict[str, str] | None = None
    ) -> tuple[ort.InferenceSession, list[str]]:
        """An InferenceSession for ``source`` (a path or serialized model) and the providers it
        really uses; ``ModelLoadError`` if it cannot load, or falls back under ``strict``.
        ``cuda``: options added to the CUDA provider's for this session."""
        options = self.provider_options
        if cuda:
            pairs = zip(self.providers, options, strict=True)
            options = [dict(o, **cuda) if p == CUDA else o for p, o in pairs]
        try:
            with warnings.catch_warnings():
                # onnxruntime warns of a missing provider; the message below says it better.
                warnings.simplefilter("ignore", UserWarning)
                session = ort.InferenceSession(
                    source,
                    sess_options=self.options,
                    providers=self.providers,
                    provider_options=options,
                )
        except Exception as exc:  # onnxruntime raises its own exception types
            raise ModelLoadError(
                f"{label}: onnxruntime cannot load it: {first_line(exc)}"
            ) from None
        in_use = session.get_providers()
        missing = [p for p in self.providers if p not in in_use]
        if missing and self.strict:
            raise ModelLoadError(
                f"{label}: requested execution provider(s) {', '.join(missing)} unavailable "
                f"({self._why(missing)}); refusing to start (GELU_STRICT_PROVIDERS=true)"
            )
        for provider in missing:
            if provider not in self._reported:
                self._reported.add(provider)
                logger.warning(
                    "requested execution provider %s unavailable (%s); running on %s",
                    provider,
                    self._why([provider]),
                    ", ".join(in_use),
                )
        return session, in_use

    @staticmethod
    def _why(missing: list[str]) -> str:
        """What onnxruntime offers, and the libraries a missing GPU provider lacks."""
        capi = Path(ort.__file__).parent / "capi"
        reasons = [r for r in (provider_unloadable(p, capi) for p in missing) if r]
        offered = f"onnxruntime offers {', '.join(ort.get_available_providers())}"
        return "; ".join([offered, *reasons])


def _tensors(graph: onnx.GraphProto) -> Iterator[onnx.TensorProto]:
    """Every tensor a graph holds: initializers, sparse ones, and those of its nodes'
    attributes, subgraphs included."""
    yield from graph.initializer
    for sparse in graph.sparse_initializer:
        yield from (sparse.values, sparse.indices)
    yield from _attribute_tensors(graph.node)


def _attribute_tensors(nodes: Iterable[onnx.NodeProto]) -> Iterator[onnx.TensorProto]:
    for node in nodes:
        for attribute in node.attribute:
            yield from (attribute.t, *attribute.tensors)
            for sparse in (attribute.sparse_tensor, *attribute.sparse_tensors):
                yield from (sparse.values, sparse.indices)
            for graph in (attribute.g, *attribute.graphs):
                yield from _tensors(graph)


def _parsed(model: bytes, label: str) -> onnx.ModelProto:
    try:
        return onnx.ModelProto.FromString(model)
    except Exception as exc:  # protobuf's DecodeError, or what its C parser raises
        raise ModelLoadError(
            f"{label}: onnxruntime cannot load it: not an ONNX model ({first_line(exc)})"
        ) from None


def refuse_external_data(model: bytes, label: str) -> None:
    """``ModelLoadError`` for a model whose tensors live in external files. A model is one
    file, signed and read as one: given bytes, onnxruntime would resolve an external file
    against the working directory, outside what was verified, the path-escape class of onnx
    CVE-2024-27318 and CVE-2026-27489 (issue 62, item 4). Export writes none."""
    proto = _parsed(model, label)
    functions = (f.node for f in proto.functions)
    for tensor in itertools.chain(_tensors(proto.graph), *map(_attribute_tensors, functions)):
        if tensor.data_location == onnx.TensorProto.EXTERNAL or tensor.external_data:
            raise ModelLoadError(
                f"{label}: tensor {tensor.name!r} keeps its data in an external file; only "
                "single-file models load"
            )


def resident_bytes() -> int:
    """The process's resident memory now (Linux), or 0 where it cannot be read."""
    try:
        with open("/proc/self/statm") as statm:
            return int(statm.read().split()[1]) * PAGE_BYTES
    except (OSError, IndexError, ValueError):
        return 0


def _specs(arguments: list[ort.NodeArg]) -> list[TensorSpec]:
    return [
        TensorSpec(
            a.name,
            ONNX_TO_V2.get(a.type, a.type),
            tuple(d if isinstance(d, int) else -1 for d in a.shape),
        )
        for a in arguments
    ]


def _declared_spec(value: onnx.ValueInfoProto) -> TensorSpec:
    """A graph input or output as onnxruntime's ``get_inputs`` would describe it."""
    kind = value.type.WhichOneof("value")
    if kind != "tensor_type":
        return TensorSpec(value.name, str(kind), ())
    tensor = value.type.tensor_type
    name = onnx.TensorProto.DataType.Name(tensor.elem_type).lower()
    dims = tuple(d.dim_value if d.HasField("dim_value") else -1 for d in tensor.shape.dim)
    return TensorSpec(value.name, ONNX_TO_V2.get(f"tensor({name})", name), dims)


class OrtSession:
    """One model file on onnxruntime (``service.runtime.Session``)."""

    run: Callable[[list[str], dict[str, np.ndarray]], list[np.ndarray]]

    def __init__(self, session: ort.InferenceSession, providers: list[str], memory: int) -> None:
        # onnxruntime's own bound method: a run through the interface costs no call more.
        self.run = session.run
        self.providers = providers
        self.provider_options = {
            provider: options
            for provider, options in session.get_provider_options().items()
            if provider in providers
        }
        self.inputs = _specs(session.get_inputs())
        self.outputs = _specs(session.get_outputs())
        self.metadata_props = dict(session.get_modelmeta().custom_metadata_map)
        self.memory_bytes = memory

    def close(self) -> None:
        # onnxruntime frees a session when the last reference to it goes: this one (and a
        # bound session's instances).
        del self.run


class OnnxRuntime:
    """Opens model files as onnxruntime sessions (``service.runtime.Runtime``). On CUDA a
    version with more than one instance, CUDA graphs or ``binding`` (the setting
    ``GELU_CUDA_IO_BINDING``) is a ``service.binding.BoundSession``."""

    def __init__(self, sessions: SessionFactory, binding: bool = False) -> None:
        self.sessions = sessions
        self.binding = binding

    def declared(self, model: bytes, label: str) -> tuple[list[TensorSpec], list[TensorSpec]]:
        """The model file's graph inputs (its initializers aside) and outputs, read from the
        protobuf: nothing of it runs, and onnxruntime never sees bytes not yet verified."""
        graph = _parsed(model, label).graph
        weights = {tensor.name for tensor in graph.initializer}
        inputs = [_declared_spec(v) for v in graph.input if v.name not in weights]
        return inputs, [_declared_spec(v) for v in graph.output]

    def open(self, model: bytes, label: str, placement: Placement = ONE_INSTANCE) -> OrtSession:
        refuse_external_data(model, label)
        before = resident_bytes()
        graphs = placement.cuda_graphs
        cuda = {"enable_cuda_graph": "1"} if graphs else None
        session, in_use = self.sessions.create(model, label, cuda)
        opened = OrtSession(session, in_use, 0)
        if in_use[0] == CUDA and (self.binding or graphs or placement.instances > 1):
            sessions = [session] + [
                self.sessions.create(model, label, cuda)[0] for _ in range(placement.instances - 1)
            ]
            device = ("cuda", int(opened.provider_options[CUDA].get("device_id", "0")))
            specs = (opened.inputs, opened.outputs)
            opened.run = BoundSession(sessions, graphs, specs, device, label, self.binding).run
        elif graphs:
            logger.warning("%s: CUDA graphs asked for, but it runs on %s", label, in_use[0])
        opened.memory_bytes = max(0, resident_bytes() - before)
        return opened
