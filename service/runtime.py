"""The runtime interface: what the serving core needs of whatever runs a model.

A ``Runtime`` opens a version's model file as a ``Session`` (the tensors it declares, the
providers it really runs on, the memory it took, ``run`` and ``close``); ``Model`` is one
version on a session, checked against its ``config.pbtxt``, warmed and timed the same way
whichever runtime holds it. onnxruntime, on CPU or CUDA, is the one runtime today
(``service.onnxrt``); where versions live on disk is the repository's (``service.repository``).
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

from contract.metadata import ModelMetadata
from contract.model_config import ModelConfig, TensorConfig, Warmup, WarmupInput
from service.codecs import cast
from service.errors import BadInputError, ModelLoadError, PayloadTooLargeError
from service.inference import InferenceRequest, RequestInput, RequestOutput


@dataclass(frozen=True)
class TensorSpec:
    """A tensor as a model file declares it: V2 datatype, dims (-1 where not fixed)."""

    name: str
    datatype: str
    dims: tuple[int, ...]


class Session(Protocol):
    """One model file opened on a runtime."""

    @property
    def providers(self) -> list[str]:
        """The execution providers it really runs on, in order of preference."""

    @property
    def provider_options(self) -> dict[str, dict[str, str]]:
        """Each provider's options in force, as the runtime reports them."""

    @property
    def inputs(self) -> list[TensorSpec]:
        """Its inputs, as the file declares them."""

    @property
    def outputs(self) -> list[TensorSpec]:
        """Its outputs, as the file declares them."""

    @property
    def metadata_props(self) -> dict[str, str]:
        """The file's metadata (the repository contract's keys, ``contract.metadata``)."""

    @property
    def memory_bytes(self) -> int:
        """What opening it took of the process's memory, measured (0 where unknown)."""

    def run(self, outputs: list[str], feed: dict[str, np.ndarray]) -> list[np.ndarray]:
        """The named outputs for ``feed``; blocks (the core calls it off the event loop or
        within the inline bound)."""

    def close(self) -> None:
        """Let its memory go; no run follows."""


@dataclass(frozen=True)
class Placement:
    """How config.pbtxt places a version: Triton's ``instance_group`` count, and the batch
    sizes of its ``optimization { cuda { graphs } }``. A runtime honours what its device
    can (onnxruntime: both on CUDA; on the CPU, one session that runs ``instances`` at once)."""

    instances: int = 1
    cuda_graphs: tuple[int, ...] = ()


ONE_INSTANCE = Placement()  # what a config without instance_group or graphs asks for


class Runtime(Protocol):
    """What opens model files as sessions."""

    def open(self, model: bytes, label: str, placement: Placement = ONE_INSTANCE) -> Session:
        """A model file's bytes, as read (and verified) once by the repository, opened;
        ``ModelLoadError`` (naming ``label``) if they cannot be. Never a path: what is
        checked is what loads (issue 62, item 4)."""

    def declared(self, model: bytes, label: str) -> tuple[list[TensorSpec], list[TensorSpec]]:
        """The inputs and outputs a model file's bytes declare, as an opened session would
        list them, read without opening it: what a config is derived from, before any
        signature is checked. ``ModelLoadError`` if they cannot be read."""


def median_us(run: Callable[[], object], runs: int = 5) -> float:
    """The median time of ``runs`` calls of ``run``, in microseconds."""
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        run()
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e6


def largest_within(
    time_of: Callable[[int], float], budget_us: float, smallest: int, largest: int
) -> tuple[int, float]:
    """The largest size, doubling from ``smallest`` up to ``largest`` (or ``largest`` itself),
    that ``time_of(size)`` (µs) keeps within ``budget_us``, with its time; (0, the time of
    ``smallest``) if none. What runs on the event loop, for model batches and activations."""
    size, within, cost = smallest, 0, 0.0
    while True:
        took = time_of(size)
        if took > budget_us:
            return within, cost if within else took
        within, cost = size, took
        if size >= largest:
            return within, cost
        size = min(size * 2, largest)


@dataclass
class Model:
    """One version of one model, loaded on a runtime (its ``session``) and checked against
    its config; what the core batches and runs, whichever runtime holds it."""

    name: str
    version: str
    config: ModelConfig
    session: Session
    metadata: ModelMetadata
    output_names: list[str] = field(init=False)
    input_configs: dict[str, TensorConfig] = field(init=False)  # by name
    warmup_runs: int = 0  # config.pbtxt's model_warmup runs made before it was ready
    # batch_invariant (config.pbtxt): the one batch size every run has; 0 where runs take
    # batches as they come
    run_size: int = field(init=False)
    # A model that batches and takes one input: that input, and its numpy dtype; what
    # checked_inputs compares a request of one tensor against without its general pass
    only_input: tuple[TensorConfig, np.dtype] | None = field(init=False)

    def __post_init__(self) -> None:
        self.output_names = [o.name for o in self.config.outputs]
        self.input_configs = {t.name: t for t in self.config.inputs}
        self.run_size = invariant_run_size(self.config)
        inputs = self.config.inputs
        one = len(inputs) == 1 and self.config.max_batch_size > 0
        self.only_input = (inputs[0], inputs[0].numpy_dtype) if one else None

    @property
    def providers(self) -> list[str]:
        """The execution providers the session really runs on."""
        return self.session.providers

    @property
    def task(self) -> str:
        return self.metadata.task

    @property
    def inputs(self) -> tuple[TensorConfig, ...]:
        return self.config.inputs

    def infer(
        self, inputs: dict[str, np.ndarray], outputs: list[str] | None = None
    ) -> dict[str, np.ndarray]:
        """Run the session on already validated inputs; blocks, so call it off the event loop."""
        names = outputs or self.output_names
        if self.run_size:
            return self._infer_fixed(names, inputs)
        results = self.session.run(names, inputs)
        return dict(zip(names, results, strict=True))

    def _infer_fixed(
        self, names: list[str], inputs: dict[str, np.ndarray]
    ) -> dict[str, np.ndarray]:
        """``batch_invariant``: the batch run in slices of ``run_size`` rows, the last padded
        with copies of its last row, so every run the session sees has the one shape whoever
        shares the batch; each row's answer is then what it is alone (docs/serving.md)."""
        size = self.run_size
        rows = len(next(iter(inputs.values())))
        parts: list[list[np.ndarray]] = []
        for start in range(0, rows, size):
            taken = min(size, rows - start)
            feed = {}
            for name, array in inputs.items():
                piece = array[start : start + taken]
                if taken < size:  # its last row again: a value of its own kind (BYTES too)
                    piece = np.concatenate([piece, np.repeat(piece[-1:], size - taken, axis=0)])
                feed[name] = piece
            parts.append([r[:taken] for r in self.session.run(names, feed)])
        if len(parts) == 1:
            return dict(zip(names, parts[0], strict=True))
        return {n: np.concatenate([p[i] for p in parts]) for i, n in enumerate(names)}

    def checked_inputs(self, given: list[RequestInput], maximum: int) -> dict[str, np.ndarray]:
        """A request's inputs by name: names, datatypes, shapes and batch sizes checked against
        this version, and a batch of at most ``maximum`` rows (0: no bound); ``BadInputError`` or
        ``PayloadTooLargeError`` saying what is wrong."""
        only = self.only_input
        if only is not None and len(given) == 1:
            # The common case, a batch for a model of one input, in a few comparisons: a
            # request that is not exactly right gets the general pass below, and its answer.
            config, dtype = only
            tensor = given[0]
            if tensor.name is None:  # V1: the model's only input
                array = cast(tensor.array, dtype, "instances")
                fits = True
            else:
                array = tensor.array
                fits = tensor.name == config.name and tensor.datatype == config.datatype
            shape = array.shape
            batch = shape[0] if shape else 0
            if fits and batch and shape[1:] == config.dims and (not maximum or batch <= maximum):
                return {config.name: array}
        return self._checked_inputs(given, maximum)

    def _checked_inputs(self, given: list[RequestInput], maximum: int) -> dict[str, np.ndarray]:
        declared = self.input_configs
        batched = self.config.max_batch_size > 0
        inputs: dict[str, np.ndarray] = {}
        for tensor in given:
            if tensor.name is None:  # V1: the model's only input
                if len(declared) != 1:
                    raise BadInputError(
                        f"model {self.name!r} takes inputs {sorted(declared)}: name them (V2)"
                    )
                config = next(iter(declared.values()))
                array = cast(tensor.array, config.numpy_dtype, tensor.describe())
            else:
                config = declared.get(tensor.name)  # type: ignore[assignment]
                if config is None:
                    raise BadInputError(
                        f"unknown input {tensor.name!r} for model {self.name!r}; "
                        f"expected {sorted(declared)}"
                    )
                if tensor.datatype != config.datatype:
                    raise BadInputError(
                        f"{tensor.describe()}: datatype {tensor.datatype!r} does not match "
                        f"the model's {config.datatype}"
                    )
                array = tensor.array
            what = tensor.describe()
            if config.name in inputs:
                raise BadInputError(f"{what} appears twice")
            if not batched:  # max_batch_size 0: the shape is the model's, whole
                if not dims_match(array.shape, config.dims):
                    raise BadInputError(
                        f"{what}: shape {list(array.shape)} does not match the model's "
                        f"{list(config.dims)} (it has no batch axis)"
                    )
                inputs[config.name] = array
                continue
            if array.ndim >= 1 and len(array) == 0:
                raise BadInputError("empty batch: send at least one instance")
            if array.ndim == 0 or (
                array.shape[1:] != config.dims and not dims_match(array.shape[1:], config.dims)
            ):
                raise BadInputError(
                    f"{what}: shape {list(array.shape)} does not match the model's "
                    f"[-1, {', '.join(map(str, config.dims))}] (each instance must have shape "
                    f"{list(config.dims)})"
                )
            if maximum and len(array) > maximum:
                raise PayloadTooLargeError(
                    f"batch of {len(array)} is above the maximum of {maximum}"
                )
            inputs[config.name] = array
        missing = [n for n in declared if n not in inputs]
        if missing:
            raise BadInputError(f"missing input(s) {missing} for model {self.name!r}")
        if batched and len({len(a) for a in inputs.values()}) > 1:
            raise BadInputError("inputs have different batch sizes")
        return inputs

    def checked_outputs(self, request: InferenceRequest) -> list[RequestOutput] | None:
        """The outputs asked for, each known to the model; None for every output (the common
        case, which then costs no per-output records)."""
        if request.outputs is None:
            return None
        for output in request.outputs:
            if output.name not in self.output_names:
                raise BadInputError(
                    f"unknown output {output.name!r} for model {self.name!r}; "
                    f"expected {self.output_names}"
                )
        return request.outputs

    def close(self) -> None:
        """Release the session (its requests have finished)."""
        self.session.close()

    def example_feed(self, batch: int) -> dict[str, np.ndarray]:
        """Zeros of every input for a batch of ``batch`` (a model without a batch axis,
        ``max_batch_size: 0``, takes its dims as they are); -1 dims are given 1."""
        lead = (batch,) if self.config.max_batch_size else ()
        return {
            t.name: np.zeros((*lead, *(d if d >= 0 else 1 for d in t.dims)), t.numpy_dtype)
            for t in self.inputs
        }

    def warm_up(self, runs: int) -> None:
        """Run a few batches through the session so the first client pays no set-up cost."""
        for batch in (1, 8, 1, 8)[:runs]:
            self.infer(self.example_feed(batch))

    def run_warmups(self, files: Mapping[str, bytes]) -> list[str]:
        """config.pbtxt's ``model_warmup`` samples, each run ``count`` times; ``files``: the
        bytes of each ``input_data_file`` by its name there, read (and verified) with the
        model's files from its ``warmup/`` folder. What ran, for the log; ``ModelLoadError``
        for a sample that does not fit the model."""
        label, ran = f"{self.name}/{self.version}", []
        for warmup in self.config.warmups:
            feed = {i.name: self._warmup_array(i, warmup, files, label) for i in warmup.inputs}
            if set(feed) != set(self.input_configs):
                raise ModelLoadError(
                    f"{label}: model_warmup {warmup.name!r} gives inputs {sorted(feed)}; the "
                    f"model takes {sorted(self.input_configs)}"
                )
            for _ in range(warmup.count):
                self.infer(feed)
            self.warmup_runs += warmup.count
            ran.append(f"{warmup.name!r} ({warmup.count} x batch {warmup.batch_size})")
        return ran

    def _warmup_array(
        self, given: WarmupInput, warmup: Warmup, files: Mapping[str, bytes], label: str
    ) -> Any:
        config = self.input_configs.get(given.name)
        if config is None or (config.datatype, config.dims) != (given.datatype, given.dims):
            raise ModelLoadError(
                f"{label}: model_warmup {warmup.name!r} input {given.name!r} is not one of the "
                "model's inputs with that data_type and dims"
            )
        dtype = config.numpy_dtype
        shape = (warmup.batch_size, *given.dims) if self.config.max_batch_size else given.dims
        if given.source == "zero":
            return np.zeros(shape, dtype)
        if given.source == "random":
            values = np.random.default_rng(0).random(shape)
            return values.astype(dtype)
        raw = files.get(given.file)
        if raw is None:
            raise ModelLoadError(f"{label}: model_warmup file {given.file!r} was not read")
        if len(raw) % dtype.itemsize:
            raise ModelLoadError(
                f"{label}: model_warmup file {given.file!r} is not a whole number of "
                f"{config.datatype} values ({len(raw)} bytes)"
            )
        one = np.frombuffer(raw, dtype)
        if one.size != int(np.prod(given.dims)):
            raise ModelLoadError(
                f"{label}: model_warmup file {given.file!r} holds {one.size} values; dims "
                f"{list(given.dims)} need {int(np.prod(given.dims))}"
            )
        # As Triton: the file is one sample, repeated for each of the batch's.
        return np.broadcast_to(one.reshape(given.dims), shape).copy()

    def time_run(self, batch: int, runs: int = 5) -> float:
        """The median time of one run on a batch of ``batch`` zeros, in microseconds."""
        feed = self.example_feed(batch)
        return median_us(lambda: self.infer(feed), runs)

    def largest_batch_within(self, budget_us: float, largest: int) -> tuple[int, float]:
        """The largest power-of-two batch up to ``largest`` (or ``largest`` itself) whose run
        takes at most ``budget_us``, timed here, with its time; (0, time of one) if none. A
        model without a batch axis runs one request at a time: 1 or 0."""
        largest = largest if self.config.max_batch_size else 1
        return largest_within(self.time_run, budget_us, 1, largest)

    def check_against_config(self) -> None:
        """The session's inputs and outputs must be exactly those ``config.pbtxt`` declares."""
        label = f"{self.name}/{self.version}"
        for kind, declared, actual in (
            ("input", self.config.inputs, self.session.inputs),
            ("output", self.config.outputs, self.session.outputs),
        ):
            skip = 1 if self.config.max_batch_size else 0  # the batch axis
            got = {a.name: (a.datatype, a.dims[skip:]) for a in actual}
            want = {d.name: (d.datatype, d.dims) for d in declared}
            if set(got) != set(want):
                raise ModelLoadError(
                    f"{label}: {kind}s in model.onnx {sorted(got)} != config.pbtxt {sorted(want)}"
                )
            for name, (datatype, dims) in want.items():
                if got[name][0] != datatype or not dims_match(got[name][1], dims):
                    raise ModelLoadError(
                        f"{label}: {kind} {name!r} is {got[name][0]} {list(got[name][1])} in "
                        f"model.onnx but {datatype} {list(dims)} in config.pbtxt"
                    )


def invariant_run_size(config: ModelConfig) -> int:
    """The batch size every run of a ``batch_invariant`` model has: 1 for "rows"; for "pad",
    its largest CUDA graph's (the binding pads to it too), else ``max_batch_size``. 0 when
    off."""
    if config.batch_invariant == "rows":
        return 1
    if config.batch_invariant == "pad":
        return max(config.cuda_graphs, default=config.max_batch_size)
    return 0


def dims_match(actual: tuple[int, ...], declared: tuple[int, ...]) -> bool:
    """Shapes agree: same rank, and equal wherever both are known (-1: any size)."""
    return len(actual) == len(declared) and all(
        a == d or a == -1 or d == -1 for a, d in zip(actual, declared, strict=True)
    )
