"""A model on the GPU as Triton places it: ``instance_group { kind: KIND_GPU count: N }`` is N
onnxruntime sessions on the device, and ``optimization { cuda { graphs: true } }`` a CUDA
graph per batch size; with ``GELU_CUDA_IO_BINDING`` the other batches run through I/O binding,
which measured slower than the plain run (docs/serving.md, "Instances, CUDA graphs and I/O
binding").

A graph replays a captured run on fixed device buffers: a batch is padded with zeros up to the
smallest captured size that holds it (one larger than every size runs uncaptured,
``gpu_graph_id`` -1), and the padding's rows are cut from the answers. The same code runs on
the CPU device, where nothing is captured, so the padding and binding are tested without a GPU.
"""

from __future__ import annotations

import bisect
import queue
from collections.abc import Sequence

import numpy as np
import onnxruntime as ort

from contract.model_config import V2_TO_NUMPY
from service.errors import ModelLoadError, first_line
from service.runtime import TensorSpec

SKIP_GRAPH = "-1"  # onnxruntime's gpu_graph_id for a run neither captured nor replayed
CAPTURE_RUNS = 3  # onnxruntime runs a graph id uncaptured first; capture is done at load


class _Graph:
    """One captured batch size: device buffers for every input and output, bound once."""

    def __init__(
        self,
        session: ort.InferenceSession,
        batch: int,
        specs: tuple[list[TensorSpec], list[TensorSpec]],
        device: tuple[str, int],
    ) -> None:
        self.batch = batch
        self.zeros = {
            s.name: np.zeros((batch, *s.dims[1:]), V2_TO_NUMPY[s.datatype]) for s in specs[0]
        }
        self.inputs: dict[str, ort.OrtValue] = {}
        self.outputs: dict[str, ort.OrtValue] = {}
        self.binding = session.io_binding()
        for kind, tensors in zip(("input", "output"), specs, strict=True):
            for spec in tensors:
                value = ort.OrtValue.ortvalue_from_shape_and_type(
                    [batch, *spec.dims[1:]], V2_TO_NUMPY[spec.datatype], *device
                )
                if kind == "input":
                    self.inputs[spec.name] = value
                    self.binding.bind_ortvalue_input(spec.name, value)
                else:
                    self.outputs[spec.name] = value
                    self.binding.bind_ortvalue_output(spec.name, value)
        self.options = ort.RunOptions()
        self.options.add_run_config_entry("gpu_graph_id", str(batch))
        # A CPU OrtValue's numpy() is a view of its buffer, which the next run overwrites; a
        # device's is a fresh host copy.
        self.copy = device[0] == "cpu"

    def run(
        self, session: ort.InferenceSession, names: list[str], feed: dict[str, np.ndarray]
    ) -> list[np.ndarray]:
        rows = 0
        for name, array in feed.items():
            rows = len(array)
            if rows < self.batch:  # zeros below the batch's rows: a padded batch
                padded = self.zeros[name].copy()
                padded[:rows] = array
                array = padded
            self.inputs[name].update_inplace(np.ascontiguousarray(array))
        session.run_with_iobinding(self.binding, self.options)
        answers = [self.outputs[name].numpy()[:rows] for name in names]
        return [a.copy() for a in answers] if self.copy else answers


class _Instance:
    """One session on the device, with its graphs."""

    def __init__(
        self,
        session: ort.InferenceSession,
        graphs: Sequence[int],
        specs: tuple[list[TensorSpec], list[TensorSpec]],
        device: tuple[str, int],
        bind: bool,
    ) -> None:
        self.session = session
        self.device = device
        self.bind = bind
        self.sizes = sorted(graphs)
        self.graphs = [_Graph(session, batch, specs, device) for batch in self.sizes]
        self.uncaptured = ort.RunOptions()
        if graphs:
            self.uncaptured.add_run_config_entry("gpu_graph_id", SKIP_GRAPH)

    def run(self, names: list[str], feed: dict[str, np.ndarray]) -> list[np.ndarray]:
        if self.sizes:
            rows = len(next(iter(feed.values())))
            at = bisect.bisect_left(self.sizes, rows)
            if at < len(self.sizes):
                return self.graphs[at].run(self.session, names, feed)
        if not self.bind:
            return self.session.run(names, feed, self.uncaptured)
        binding = self.session.io_binding()
        for name, array in feed.items():
            binding.bind_cpu_input(name, np.ascontiguousarray(array))
        for name in names:
            binding.bind_output(name, *self.device)
        self.session.run_with_iobinding(binding, self.uncaptured)
        return binding.copy_outputs_to_cpu()

    def capture(self, label: str) -> None:
        """Run each graph's batch of zeros until onnxruntime has captured it."""
        for graph in self.graphs:
            try:
                for _ in range(CAPTURE_RUNS):
                    graph.run(self.session, [], graph.zeros)
            except Exception as exc:  # onnxruntime's own: a node off the GPU, say
                raise ModelLoadError(
                    f"{label}: cannot capture a CUDA graph of batch {graph.batch}: "
                    f"{first_line(exc)}"
                ) from None


class BoundSession:
    """N sessions of one model file on one device (``service.runtime.Session``'s ``run``):
    a run takes a free instance, so N batches run at once, each on its own CUDA stream. A
    batch no graph holds runs bound (``bind``) or by onnxruntime's plain run."""

    def __init__(
        self,
        sessions: list[ort.InferenceSession],
        graphs: Sequence[int],
        specs: tuple[list[TensorSpec], list[TensorSpec]],
        device: tuple[str, int],
        label: str,
        bind: bool = False,
    ) -> None:
        if graphs:
            varying = [s.name for t in specs for s in t if -1 in s.dims[1:]]
            if varying:
                raise ModelLoadError(
                    f"{label}: CUDA graphs need fixed dims past the batch axis; "
                    f"{', '.join(varying)} vary"
                )
        self._free: queue.SimpleQueue[_Instance] = queue.SimpleQueue()
        self.instances = [_Instance(s, graphs, specs, device, bind) for s in sessions]
        for instance in self.instances:
            instance.capture(label)
            self._free.put(instance)

    def run(self, names: list[str], feed: dict[str, np.ndarray]) -> list[np.ndarray]:
        instance = self._free.get()  # the batcher runs at most N at once: seldom waits
        try:
            return instance.run(names, feed)
        finally:
            self._free.put(instance)
