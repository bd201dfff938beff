"""Triton's ``config.pbtxt`` as a typed ``ModelConfig``, both ways, through Triton's own schema.

The text is parsed by protobuf's ``text_format`` into Triton's ``inference.ModelConfig`` message
(``contract.triton``, vendored from Triton), so the grammar and its errors are Triton's; the
dataclasses here are the view the service acts on, built from that message. Export writes
through the same message. Any mistake (not UTF-8, too large, nested too deep, not text format,
outside Triton's schema, or not servable) is one ``ConfigParseError`` that names the file and,
where it is known, the line. Torch-free: the service imports it.
"""

from __future__ import annotations

import io
import re
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
from google.protobuf import text_format
from google.protobuf.descriptor import FieldDescriptor
from google.protobuf.message import Message
from google.protobuf.message_factory import GetMessageClass

from contract.names import CONFIG_FILENAME, ENSEMBLE_PLATFORM, PLATFORM
from contract.triton import model_config_pb2 as triton

# Triton's data types, the Open Inference Protocol's names for them, and numpy's.
TRITON_TO_V2 = {
    "TYPE_BOOL": "BOOL",
    "TYPE_UINT8": "UINT8",
    "TYPE_INT8": "INT8",
    "TYPE_INT16": "INT16",
    "TYPE_INT32": "INT32",
    "TYPE_INT64": "INT64",
    "TYPE_FP16": "FP16",
    "TYPE_FP32": "FP32",
    "TYPE_FP64": "FP64",
}
V2_TO_TRITON = {v2: triton for triton, v2 in TRITON_TO_V2.items()}
V2_TO_NUMPY: dict[str, np.dtype] = {
    "BOOL": np.dtype(np.bool_),
    "UINT8": np.dtype(np.uint8),
    "INT8": np.dtype(np.int8),
    "INT16": np.dtype(np.int16),
    "INT32": np.dtype(np.int32),
    "INT64": np.dtype(np.int64),
    "FP16": np.dtype(np.float16),
    "FP32": np.dtype(np.float32),
    "FP64": np.dtype(np.float64),
}
ONNX_TO_V2 = {
    "tensor(bool)": "BOOL",
    "tensor(uint8)": "UINT8",
    "tensor(int8)": "INT8",
    "tensor(int16)": "INT16",
    "tensor(int32)": "INT32",
    "tensor(int64)": "INT64",
    "tensor(float16)": "FP16",
    "tensor(float)": "FP32",
    "tensor(double)": "FP64",
}

# Bounds checked before protobuf reads the text: its size, and how deep braces and brackets
# nest (protobuf's text parser recurses once per level; Triton's schema needs fewer than 10).
MAX_CONFIG_BYTES = 1 << 20
MAX_CONFIG_DEPTH = 32
_WIDTH = 100  # the writer puts a message on one line when it fits in this many columns

# Strings and comments (whose braces do not count), braces and brackets; with names, for
# finding a field's line.
_SKIP = r"""#[^\n]*|"(?:[^"\\\n]|\\.)*"?|'(?:[^'\\\n]|\\.)*'?"""
_NESTING = re.compile(rf"{_SKIP}|[{{<\[]|[}}>\]]")
_NAMES = re.compile(rf"{_SKIP}|[{{<\[]|[}}>\]]|[A-Za-z_][A-Za-z0-9_]*")
_DEPTH = {"{": 1, "<": 1, "[": 1, "}": -1, ">": -1, "]": -1}
_LOCATION = re.compile(r"^(\d+):(\d+) : ")


class ConfigParseError(ValueError):
    """A config.pbtxt that is not valid text format, breaks Triton's schema, or lacks what
    serving needs; the message names the file and, where known, the line."""


class _Invalid(Exception):
    """A mistake in the message: what, and the top-level field (which occurrence) it is in."""

    def __init__(self, field: str, what: str, index: int = 0) -> None:
        super().__init__(what)
        self.field, self.what, self.index = field, what, index


def _printable(what: str) -> str:
    """``what`` on one line, its control characters escaped, at most 300 characters."""
    what = "".join(c if c.isprintable() else repr(c)[1:-1] for c in what)
    return what if len(what) <= 300 else what[:297] + "..."


def _at(source: str, what: str, line: int | None = None, column: int | None = None) -> str:
    where = source if line is None else f"{source}:{line}"
    return f"{where}{f':{column}' if column else ''}: {_printable(what)}"


def _position(text: str, offset: int) -> tuple[int, int]:
    """The line and column (both from 1) of ``offset`` in ``text``."""
    return text.count("\n", 0, offset) + 1, offset - text.rfind("\n", 0, offset)


def _decode(data: str | bytes, source: str) -> str:
    """The text, checked to be UTF-8 of at most ``MAX_CONFIG_BYTES``."""
    try:
        raw = data.encode() if isinstance(data, str) else bytes(data)
    except UnicodeEncodeError as exc:  # a str holding lone surrogates
        line, column = _position(data, exc.start) if isinstance(data, str) else (None, None)
        raise ConfigParseError(_at(source, "not UTF-8", line, column)) from None
    if len(raw) > MAX_CONFIG_BYTES:
        raise ConfigParseError(_at(source, f"{len(raw)} bytes, more than {MAX_CONFIG_BYTES}"))
    try:
        return raw.decode()
    except UnicodeDecodeError as exc:
        line = raw.count(b"\n", 0, exc.start) + 1
        column = exc.start - raw.rfind(b"\n", 0, exc.start)
        what = f"not UTF-8 (byte {raw[exc.start]:#04x})"
        raise ConfigParseError(_at(source, what, line, column)) from None


def _check_nesting(text: str, source: str) -> None:
    depth = 0
    for match in _NESTING.finditer(text):
        depth = max(depth + _DEPTH.get(match.group(), 0), 0)
        if depth > MAX_CONFIG_DEPTH:
            line, column = _position(text, match.start())
            raise ConfigParseError(
                _at(source, f"nested deeper than {MAX_CONFIG_DEPTH} levels", line, column)
            )


def _line_of(text: str, field: str, index: int) -> int | None:
    """The line that names top-level ``field`` (its ``index``-th naming, else its last)."""
    depth, lines = 0, []
    for match in _NAMES.finditer(text):
        token = match.group()
        if depth == 0 and token == field:
            lines.append(match.start())
        depth = max(depth + _DEPTH.get(token, 0), 0)
    return _position(text, lines[min(index, len(lines) - 1)])[0] if lines else None


def parse_config(data: str | bytes, source: str = CONFIG_FILENAME) -> triton.ModelConfig:
    """``config.pbtxt`` (UTF-8 bytes, or text) as Triton's ``ModelConfig`` message, read as
    Triton reads it (protobuf's text format: an unknown field, a repeated singular field or a
    value of the wrong type is an error); ``ConfigParseError`` names ``source`` and the line."""
    text = _decode(data, source)
    _check_nesting(text, source)
    message = triton.ModelConfig()
    try:
        text_format.Parse(text, message)
    except text_format.ParseError as exc:
        found = _LOCATION.match(str(exc))
        if found is None:
            raise ConfigParseError(_at(source, str(exc) or "not protobuf text format")) from None
        line, column = int(found[1]), int(found[2])
        raise ConfigParseError(_at(source, str(exc)[found.end() :], line, column)) from None
    return message


@dataclass(frozen=True)
class TensorConfig:
    """One input or output: name, V2 datatype and dims without the batch dimension."""

    name: str
    datatype: str
    dims: tuple[int, ...]

    @property
    def numpy_dtype(self) -> np.dtype:
        return V2_TO_NUMPY[self.datatype]


@dataclass(frozen=True)
class WarmupInput:
    """One input of a ``model_warmup`` sample: its tensor, and where its values come from:
    ``zero``, ``random`` or ``file`` (raw row-major bytes in the model's ``warmup/`` folder)."""

    name: str
    datatype: str
    dims: tuple[int, ...]
    source: str
    file: str = ""


@dataclass(frozen=True)
class Warmup:
    """One of Triton's ``model_warmup`` samples: run ``count`` times before the version is
    ready, a batch of ``batch_size`` (0 for a model without a batch axis)."""

    name: str
    batch_size: int
    inputs: tuple[WarmupInput, ...]
    count: int = 1


@dataclass(frozen=True)
class VersionPolicy:
    """Triton's ``version_policy``: which of a model's versions are served.

    ``latest`` serves the ``num_versions`` highest, ``all`` every one, ``specific`` those
    listed; absent from ``config.pbtxt``, Triton's default is ``latest { num_versions: 1 }``.
    """

    kind: str = "latest"  # "latest", "all" or "specific"
    num_versions: int = 1
    versions: tuple[int, ...] = ()

    def select(self, available: list[int]) -> list[int]:
        """The versions to serve among ``available``, in ascending order."""
        ordered = sorted(available)
        if self.kind == "all":
            return ordered
        if self.kind == "specific":
            return [v for v in ordered if v in self.versions]
        return ordered[-self.num_versions :] if self.num_versions > 0 else []


SERVE_ALL = VersionPolicy("all")
REJECT, DELAY = "REJECT", "DELAY"  # Triton's ModelQueuePolicy.TimeoutAction
DELAY_ACTION = triton.ModelQueuePolicy.TimeoutAction.Value(DELAY)


@dataclass(frozen=True)
class QueuePolicy:
    """Triton's ``ModelQueuePolicy``: what one priority level's queue does with its requests.

    A request may wait ``default_timeout_us`` (0: without end) before it runs; then
    ``timeout_action`` REJECT fails it ("Request timeout expired") and DELAY lets it wait on,
    behind the level's requests whose timeout has not passed. With ``allow_timeout_override``
    a request's own ``timeout`` shortens it, never lengthens it (Triton's rule: with no
    default timeout, a request's own is then ignored). A level holding ``max_queue_size``
    requests (0: no bound) refuses the next at once."""

    timeout_action: str = REJECT
    default_timeout_us: int = 0
    allow_timeout_override: bool = False
    max_queue_size: int = 0

    def timeout_us(self, requested: int | None) -> int:
        """A request's timeout in this queue (0: none), given its ``timeout`` parameter, as
        Triton's ``PolicyQueue::Enqueue`` decides it."""
        timeout = self.default_timeout_us
        if self.allow_timeout_override and requested and requested < timeout:
            return requested
        return timeout

    def to_json(self) -> dict[str, Any]:
        """As Triton's model configuration JSON has it."""
        return {
            "timeout_action": self.timeout_action,
            "default_timeout_microseconds": self.default_timeout_us,
            "allow_timeout_override": self.allow_timeout_override,
            "max_queue_size": self.max_queue_size,
        }


@dataclass(frozen=True)
class SchedulingPolicy:
    """``dynamic_batching``'s priority levels and queue policies, with Triton's names.

    ``priority_levels`` queues (0: one), 1 the highest; a batch takes the highest level's
    requests first, each level's in arrival order. A request's ``priority`` parameter names
    its level; 0, or one above ``priority_levels``, is ``default_priority_level`` (Triton's
    ``InferenceRequest::SetPriority``). Each level's queue follows its entry of
    ``priority_queue_policy``, else ``default_queue_policy``; where config.pbtxt writes
    neither (None), the server's: a request's own ``timeout``, else GELU_DEFAULT_TIMEOUT_US,
    with REJECT and no bound of the level's own."""

    priority_levels: int = 0
    default_priority_level: int = 0
    default_queue_policy: QueuePolicy | None = None
    priority_queue_policy: tuple[tuple[int, QueuePolicy], ...] = ()  # by level, ascending

    @property
    def levels(self) -> int:
        """How many queues: ``priority_levels``, at least one."""
        return max(self.priority_levels, 1)

    def level(self, priority: int) -> int:
        """The level (1 to ``levels``) of a request of ``priority``."""
        if 0 < priority <= self.priority_levels:
            return priority
        return self.default_priority_level if self.priority_levels else 1

    def policy(self, level: int) -> QueuePolicy | None:
        """The queue policy of ``level``; None: the server's."""
        if self.priority_levels:
            for key, policy in self.priority_queue_policy:
                if key == level:
                    return policy
        return self.default_queue_policy

    def to_json(self) -> dict[str, Any]:
        """Its fields of ``dynamic_batching``, as Triton's model configuration JSON has them
        (a policy config.pbtxt does not write: Triton's defaults)."""
        default = self.default_queue_policy or QueuePolicy()
        return {
            "priority_levels": self.priority_levels,
            "default_priority_level": self.default_priority_level,
            "default_queue_policy": default.to_json(),
            "priority_queue_policy": {str(k): p.to_json() for k, p in self.priority_queue_policy},
        }


@dataclass(frozen=True)
class EnsembleStep:
    """One step of Triton's ``ensemble_scheduling``: a model (and version, -1: its latest) fed
    from the ensemble's tensors (``input_map``: the model's input -> an ensemble tensor), its
    outputs named as ensemble tensors (``output_map``: the model's output -> a tensor)."""

    model_name: str
    model_version: int
    input_map: tuple[tuple[str, str], ...]
    output_map: tuple[tuple[str, str], ...]


@dataclass(frozen=True)
class ModelConfig:
    """What the service needs from ``config.pbtxt``."""

    name: str
    platform: str
    max_batch_size: int
    inputs: tuple[TensorConfig, ...]
    outputs: tuple[TensorConfig, ...]
    dynamic_batching: bool
    max_queue_delay_us: int | None
    version_policy: VersionPolicy = SERVE_ALL  # what export writes; a file without one: latest 1
    # Fields present in the file that the service does not act on (Triton's parameters,
    # sequence_batching, ...): the service warns about each.
    unhonoured: tuple[str, ...] = ()
    instance_count: int = 1  # instance_group: runs of this model at once (counts summed)
    warmups: tuple[Warmup, ...] = ()  # model_warmup: run before a version is ready
    response_cache: bool = False  # response_cache { enable: true }: answers kept (Triton's)
    steps: tuple[EnsembleStep, ...] = ()  # platform "ensemble": its ensemble_scheduling
    # optimization { cuda { graphs: true graph_spec [...] } }: a CUDA graph per batch size
    cuda_graphs: tuple[int, ...] = ()
    # dynamic_batching's priority levels and queue policies; None where it writes none
    scheduling: SchedulingPolicy | None = None
    # parameters { key: "batch_invariant" }: "rows" or "pad" (``BATCH_INVARIANT``), "" off
    batch_invariant: str = ""

    def to_message(self) -> triton.ModelConfig:
        """This config as Triton's ``ModelConfig`` message (``unhonoured`` fields are not
        kept). ``ValueError`` for what Triton's schema cannot hold: dynamic batching and
        ensemble steps at once."""
        if self.dynamic_batching and self.steps:
            raise ValueError(f"{self.name}: dynamic_batching and ensemble steps exclude each other")
        message = triton.ModelConfig(
            name=self.name, platform=self.platform, max_batch_size=self.max_batch_size
        )
        policy = message.version_policy
        if self.version_policy.kind == "all":
            policy.all.SetInParent()
        elif self.version_policy.kind == "specific":
            policy.specific.SetInParent()
            policy.specific.versions.extend(self.version_policy.versions)
        else:
            policy.latest.num_versions = self.version_policy.num_versions
        for tensors, field in ((self.inputs, message.input), (self.outputs, message.output)):
            for tensor in tensors:
                field.add(name=tensor.name, data_type=_data_type(tensor.datatype), dims=tensor.dims)
        if self.instance_count != 1:
            message.instance_group.add(count=self.instance_count)
        if self.dynamic_batching:
            message.dynamic_batching.SetInParent()
            message.dynamic_batching.max_queue_delay_microseconds = self.max_queue_delay_us or 0
            if self.scheduling is not None:
                _write_scheduling(self.scheduling, message.dynamic_batching)
        if self.cuda_graphs:
            message.optimization.cuda.graphs = True
            for size in self.cuda_graphs:
                message.optimization.cuda.graph_spec.add(batch_size=size)
        for step in self.steps:
            written = message.ensemble_scheduling.step.add(
                model_name=step.model_name, model_version=step.model_version
            )
            written.input_map.update(step.input_map)
            written.output_map.update(step.output_map)
        for warmup in self.warmups:
            sample = message.model_warmup.add(
                name=warmup.name, batch_size=warmup.batch_size, count=warmup.count
            )
            for given in warmup.inputs:
                entry = sample.inputs[given.name]
                entry.data_type = _data_type(given.datatype)
                entry.dims.extend(given.dims)
                if given.source == "file":
                    entry.input_data_file = given.file
                else:
                    setattr(entry, f"{given.source}_data", True)
        if self.response_cache:
            message.response_cache.enable = True
        if self.batch_invariant:
            message.parameters[BATCH_INVARIANT_KEY].string_value = self.batch_invariant
        return message

    def to_pbtxt(self) -> str:
        """The config.pbtxt text: Triton's message in protobuf's text format, laid out as
        Triton's examples are (a short message on one line, lists in brackets)."""
        return message_pbtxt(self.to_message())


def message_pbtxt(message: triton.ModelConfig) -> str:
    """Any Triton ``ModelConfig`` message as config.pbtxt text, laid out as ``to_pbtxt``'s:
    for a file read with ``parse_config`` and changed, every field it held kept."""
    return "".join(f"{line}\n" for line in _lines(message, 0))


def derive_model_config(
    name: str,
    inputs: list[tuple[str, str, tuple[int, ...]]],
    outputs: list[tuple[str, str, tuple[int, ...]]],
    default_max_batch_size: int,
) -> ModelConfig:
    """The ``config.pbtxt`` Triton's ONNX backend would complete from the model itself.

    ``inputs`` and ``outputs`` are (name, V2 datatype, dims) as the model file declares them,
    -1 for a dimension that is not fixed (a type with no V2 datatype as the file names it,
    such as ``tensor(string)``). When every tensor's first dimension is not fixed it is taken
    as the batch axis (``max_batch_size: default_max_batch_size``, dynamic batching on);
    otherwise the model has none (``max_batch_size: 0``, dims as declared).
    ``ConfigParseError`` for a type the service cannot serve.
    """
    batching = all(len(dims) >= 1 and dims[0] == -1 for _, _, dims in [*inputs, *outputs])
    served = set(ONNX_TO_V2.values())

    def tensor(spec: tuple[str, str, tuple[int, ...]]) -> TensorConfig:
        tensor_name, datatype, dims = spec
        if datatype not in served:
            raise ConfigParseError(f"{tensor_name}: unsupported type {datatype}")
        return TensorConfig(tensor_name, datatype, tuple(dims[1:] if batching else dims))

    return ModelConfig(
        name=name,
        platform=PLATFORM,
        max_batch_size=default_max_batch_size if batching else 0,
        inputs=tuple(tensor(t) for t in inputs),
        outputs=tuple(tensor(t) for t in outputs),
        dynamic_batching=batching,
        max_queue_delay_us=0 if batching else None,
        version_policy=VersionPolicy(),
    )


def _data_type(datatype: str) -> int:
    return triton.DataType.Value(V2_TO_TRITON[datatype])


def _write_scheduling(scheduling: SchedulingPolicy, batching: triton.ModelDynamicBatching) -> None:
    batching.priority_levels = scheduling.priority_levels
    batching.default_priority_level = scheduling.default_priority_level
    if scheduling.default_queue_policy is not None:
        _write_queue_policy(scheduling.default_queue_policy, batching.default_queue_policy)
    for level, policy in scheduling.priority_queue_policy:
        _write_queue_policy(policy, batching.priority_queue_policy[level])


def _write_queue_policy(policy: QueuePolicy, message: triton.ModelQueuePolicy) -> None:
    message.SetInParent()
    message.timeout_action = triton.ModelQueuePolicy.TimeoutAction.Value(policy.timeout_action)
    message.default_timeout_microseconds = policy.default_timeout_us
    message.allow_timeout_override = policy.allow_timeout_override
    message.max_queue_size = policy.max_queue_size


# ---- the view, from the message ------------------------------------------------------------


def _datatype(number: int, what: str, field: str, index: int) -> str:
    """The V2 datatype of Triton's ``DataType`` ``number`` (proto3 keeps numbers it does not
    name), or ``_Invalid``."""
    known = triton.DataType.DESCRIPTOR.values_by_number.get(number)
    name = known.name if known is not None else str(number)
    if name not in TRITON_TO_V2:
        raise _Invalid(field, f"{what}: unsupported data_type {name}", index)
    return TRITON_TO_V2[name]


def _tensor(tensor: triton.ModelInput | triton.ModelOutput, field: str, index: int) -> TensorConfig:
    if not tensor.name:
        raise _Invalid(field, f"{field} {index}: missing field 'name'", index)
    what = f"{field} {tensor.name!r}"
    for dim in tensor.dims:
        if dim < 1 and dim != -1:  # Triton's rule
            raise _Invalid(field, f"{what}: dimension must be integer >= 1, or -1", index)
    return TensorConfig(
        tensor.name, _datatype(tensor.data_type, what, field, index), tuple(tensor.dims)
    )


def _instance_count(message: triton.ModelConfig) -> int:
    """Triton's ``instance_group``: the counts of every group summed (a group's count, when
    unset or 0, is 1: Triton's default on CPU)."""
    for index, group in enumerate(message.instance_group):
        if group.count < 0:
            raise _Invalid(
                "instance_group", f"instance_group: count {group.count} is negative", index
            )
    return sum(group.count or 1 for group in message.instance_group) or 1


def _warmups(message: triton.ModelConfig) -> tuple[Warmup, ...]:
    """Triton's ``model_warmup``: the samples run before a version turns ready (a count of 0
    runs once, as Triton's; inputs by name)."""
    warmups = []
    for index, sample in enumerate(message.model_warmup):
        name = sample.name or "warmup"
        inputs = []
        for key in sorted(sample.inputs):
            value = sample.inputs[key]
            what = f"model_warmup {name!r} input {key!r}"
            source = value.WhichOneof("input_data_type")
            if source is None:
                raise _Invalid(
                    "model_warmup",
                    f"{what}: give one of zero_data, random_data, input_data_file",
                    index,
                )
            if any(d < 0 for d in value.dims):
                raise _Invalid("model_warmup", f"{what}: a negative dimension", index)
            datatype = _datatype(value.data_type, what, "model_warmup", index)
            kind = {"zero_data": "zero", "random_data": "random", "input_data_file": "file"}[source]
            file = value.input_data_file if kind == "file" else ""
            inputs.append(WarmupInput(key, datatype, tuple(value.dims), kind, file))
        warmups.append(Warmup(name, sample.batch_size, tuple(inputs), sample.count or 1))
    return tuple(warmups)


def _steps(message: triton.ModelConfig) -> tuple[EnsembleStep, ...]:
    """Triton's ``ensemble_scheduling``'s steps, each map a tuple of (key, value) pairs in key
    order; a version of 0 (proto3's unset) is -1, the latest."""
    steps = []
    for index, step in enumerate(message.ensemble_scheduling.step):
        if not step.model_name:
            raise _Invalid(
                "ensemble_scheduling", "ensemble_scheduling: a step without model_name", index
            )
        steps.append(EnsembleStep(step.model_name, step.model_version or -1,
                                  tuple(sorted(step.input_map.items())),
                                  tuple(sorted(step.output_map.items()))))  # fmt: skip
    return tuple(steps)


def _cuda_graphs(message: triton.ModelConfig) -> tuple[int, ...]:
    """Triton's ``optimization { cuda { graphs: true graph_spec [{ batch_size: N }] } }``: the
    batch sizes to capture a CUDA graph for, each batch padded up to the next; without a
    graph_spec, every power of two up to max_batch_size, and max_batch_size itself."""
    cuda = message.optimization.cuda
    if not cuda.graphs:
        return ()
    largest = message.max_batch_size
    if largest < 1:
        raise _Invalid("optimization", "optimization.cuda.graphs needs max_batch_size >= 1")
    sizes, what = [], "optimization.cuda.graph_spec"
    for spec in cuda.graph_spec:
        if any(field.name != "batch_size" for field, _ in spec.ListFields()):
            raise _Invalid("optimization", f"{what}: give batch_size alone")
        if not 1 <= spec.batch_size <= largest:
            raise _Invalid(
                "optimization",
                f"{what}: batch_size {spec.batch_size} is not in 1..{largest}",
            )
        sizes.append(spec.batch_size)
    if not sizes:
        sizes = [1 << k for k in range(largest.bit_length()) if 1 << k < largest]
        sizes.append(largest)
    return tuple(sorted(set(sizes)))


# Triton's model ``parameters`` key asking that a row's answer be the same bits whatever batch
# it rides in, and how each value holds it (docs/serving.md, "Batch invariance"): "rows" runs
# every row alone, "pad" every run at one batch size; "off", as no key, batches freely.
BATCH_INVARIANT_KEY = "batch_invariant"
BATCH_INVARIANT = ("rows", "pad")
PARAMETER_KEYS = frozenset({BATCH_INVARIANT_KEY})  # the parameters the service acts on


def _batch_invariant(message: triton.ModelConfig) -> str:
    """``parameters { key: "batch_invariant" value: { string_value: ... } }``: "rows", "pad",
    or "" (off, also spelled "off")."""
    parameter = message.parameters.get(BATCH_INVARIANT_KEY)
    if parameter is None:
        return ""
    value = parameter.string_value
    if value == "off":
        return ""
    if value not in BATCH_INVARIANT:
        raise _Invalid(
            "parameters",
            f"parameters {BATCH_INVARIANT_KEY}: {value!r} is not one of off, "
            f"{', '.join(BATCH_INVARIANT)}",
        )
    if message.max_batch_size < 1:
        raise _Invalid("parameters", f"parameters {BATCH_INVARIANT_KEY} needs max_batch_size >= 1")
    if message.platform == ENSEMBLE_PLATFORM:
        raise _Invalid(
            "parameters",
            f"parameters {BATCH_INVARIANT_KEY}: an ensemble runs nothing itself; set it on "
            "its steps' models",
        )
    return value


def _queue_policy(policy: triton.ModelQueuePolicy, what: str) -> QueuePolicy:
    action = triton.ModelQueuePolicy.TimeoutAction.DESCRIPTOR.values_by_number.get(
        policy.timeout_action
    )
    if action is None:  # proto3 keeps a number its enum does not name
        raise _Invalid(
            "dynamic_batching",
            f"{what}: timeout_action {policy.timeout_action} is not REJECT or DELAY",
        )
    return QueuePolicy(
        action.name,
        policy.default_timeout_microseconds,
        policy.allow_timeout_override,
        policy.max_queue_size,
    )


def _scheduling(message: triton.ModelConfig, name: str) -> SchedulingPolicy | None:
    """``dynamic_batching``'s priority levels and queue policies, checked as Triton's
    ``ValidateModelConfig`` checks them, in its words; None when it writes none of them."""
    batching = message.dynamic_batching
    fields = _present(batching) & SCHEDULING_FIELDS
    if not message.HasField("dynamic_batching") or not fields:
        return None
    levels = batching.priority_levels
    if levels:
        if not 1 <= batching.default_priority_level <= levels:
            raise _Invalid(
                "dynamic_batching",
                f"default priority level must be in range [1, {levels}] for {name}",
            )
        for level in batching.priority_queue_policy:
            if not 1 <= level <= levels:
                raise _Invalid(
                    "dynamic_batching",
                    "priority queue policy must have priority level in range "
                    f"[1, {levels}] for {name}",
                )
    if batching.preserve_ordering:
        if levels > 1:
            raise _Invalid(
                "dynamic_batching",
                f"Only one priority level is allowed when 'preserve_ordering' is true for {name}",
            )
        policies = [batching.default_queue_policy, *batching.priority_queue_policy.values()]
        for policy in policies:
            if policy.default_timeout_microseconds and policy.timeout_action == DELAY_ACTION:
                raise _Invalid(
                    "dynamic_batching",
                    "Queue policy can not have DELAY as timeout action when "
                    f"'preserve_ordering' is true for {name}",
                )
    default = None
    if batching.HasField("default_queue_policy"):
        default = _queue_policy(batching.default_queue_policy, "default_queue_policy")
    if not levels:  # one queue: Triton reads default_queue_policy alone
        return None if default is None else SchedulingPolicy(default_queue_policy=default)
    by_level = tuple(
        (
            level,
            _queue_policy(batching.priority_queue_policy[level], f"priority_queue_policy {level}"),
        )
        for level in sorted(batching.priority_queue_policy)
    )
    return SchedulingPolicy(levels, batching.default_priority_level, default, by_level)


def _present(message: Message) -> set[str]:
    return {field.name for field, _ in message.ListFields()}


def _unhonoured(message: triton.ModelConfig) -> tuple[str, ...]:
    """The fields present that the service does not act on; ``optimization`` counts as
    honoured when it holds only ``cuda``'s graphs."""
    left = _present(message) - INTERPRETED
    batching = message.dynamic_batching
    if batching.priority_queue_policy and not batching.priority_levels:
        # As Triton: with one level, only default_queue_policy is read.
        left.add("dynamic_batching.priority_queue_policy (priority_levels is 0)")
    optimization = message.optimization
    if _present(optimization) <= {"cuda"} and _present(optimization.cuda) <= {
        "graphs",
        "graph_spec",
    }:
        left.discard("optimization")
    if "parameters" in left:
        left.discard("parameters")
        left.update(f"parameters.{key}" for key in message.parameters if key not in PARAMETER_KEYS)
    return tuple(sorted(left))


def _version_policy(message: triton.ModelConfig) -> VersionPolicy:
    if not message.HasField("version_policy"):
        return VersionPolicy()  # Triton's default: the latest version
    policy = message.version_policy
    kind = policy.WhichOneof("policy_choice")
    if kind == "latest":
        if policy.latest.num_versions < 1:
            raise _Invalid(
                "version_policy", "version_policy latest: num_versions must be at least 1"
            )
        return VersionPolicy("latest", policy.latest.num_versions)
    if kind == "specific":
        return VersionPolicy("specific", versions=tuple(policy.specific.versions))
    if kind == "all":
        return SERVE_ALL
    raise _Invalid("version_policy", "version_policy must hold one of latest, all, specific")


# dynamic_batching's fields of the scheduling policy (``SchedulingPolicy``).
SCHEDULING_FIELDS = frozenset(
    {"priority_levels", "default_priority_level", "default_queue_policy", "priority_queue_policy"}
)
# The fields load_model_config interprets; any other present is reported in ``unhonoured``.
INTERPRETED = frozenset(
    {"name", "platform", "backend", "max_batch_size", "input", "output", "dynamic_batching",
     "version_policy", "instance_group", "model_warmup", "response_cache",
     "ensemble_scheduling"}
)  # fmt: skip


def _view(message: triton.ModelConfig, directory_name: str | None) -> ModelConfig:
    name = message.name or directory_name
    if not name:
        raise _Invalid("name", "missing field 'name'")
    if message.max_batch_size < 0:
        raise _Invalid("max_batch_size", f"max_batch_size {message.max_batch_size} is negative")
    batching = message.HasField("dynamic_batching")
    return ModelConfig(
        name=name,
        platform=message.platform or PLATFORM,
        max_batch_size=message.max_batch_size,
        inputs=tuple(_tensor(t, "input", i) for i, t in enumerate(message.input)),
        outputs=tuple(_tensor(t, "output", i) for i, t in enumerate(message.output)),
        dynamic_batching=batching,
        max_queue_delay_us=(
            message.dynamic_batching.max_queue_delay_microseconds if batching else None
        ),
        version_policy=_version_policy(message),
        unhonoured=_unhonoured(message),
        instance_count=_instance_count(message),
        warmups=_warmups(message),
        response_cache=message.response_cache.enable,
        steps=_steps(message),
        cuda_graphs=_cuda_graphs(message),
        scheduling=_scheduling(message, name),
        batch_invariant=_batch_invariant(message),
    )


def load_model_config(
    data: str | bytes, directory_name: str | None = None, *, source: str = CONFIG_FILENAME
) -> ModelConfig:
    """Parse and interpret a config.pbtxt (UTF-8 bytes, or text); ``ConfigParseError`` says
    what is wrong, naming ``source`` and the line. As Triton, ``name`` may be left out: it is
    then the model's ``directory_name`` (ModelMesh's Triton adapter writes configs without
    one)."""
    message = parse_config(data, source)
    try:
        return _view(message, directory_name)
    except _Invalid as exc:
        text = data if isinstance(data, str) else data.decode()  # parse_config decoded it
        raise ConfigParseError(
            _at(source, exc.what, _line_of(text, exc.field, exc.index))
        ) from None


# ---- the writer's layout -----------------------------------------------------------------


def _items(field: FieldDescriptor, value: Any) -> list[Any]:
    """A message field's values as messages: a map's as its entries, in key order."""
    if field.message_type.GetOptions().map_entry:
        entry = GetMessageClass(field.message_type)
        return [entry(key=key, value=value[key]) for key in sorted(value)]
    return list(value) if field.is_repeated else [value]


def _scalar(field: FieldDescriptor, value: Any) -> str:
    out = io.StringIO()
    text_format.PrintFieldValue(field, value, out, as_utf8=True)
    return out.getvalue()


def _scalar_field(field: FieldDescriptor, value: Any) -> str:
    """``name: value``, or ``name: [ a, b ]`` for a repeated field."""
    if field.is_repeated:
        return f"{field.name}: [ {', '.join(_scalar(field, v) for v in value)} ]"
    return f"{field.name}: {_scalar(field, value)}"


def _inline(message: Message) -> str:
    """``message`` on one line: ``{ name: "x" dims: [ 1, 2 ] }``."""
    parts = []
    for field, value in message.ListFields():
        if field.message_type is None:
            parts.append(_scalar_field(field, value))
        elif field.is_repeated and not field.message_type.GetOptions().map_entry:
            parts.append(f"{field.name} [ {', '.join(_inline(m) for m in value)} ]")
        else:
            parts.extend(f"{field.name} {_inline(m)}" for m in _items(field, value))
    return f"{{ {' '.join(parts)} }}" if parts else "{ }"


def _block(head: str, message: Message, indent: int) -> list[str]:
    """``head`` and ``message``: one line if it fits, else its fields one a line."""
    line = f"{' ' * indent}{head}{_inline(message)}"
    if len(line) <= _WIDTH:
        return [line]
    return [f"{' ' * indent}{head}{{", *_lines(message, indent + 2), f"{' ' * indent}}}"]


def _lines(message: Message, indent: int) -> Iterator[str]:
    """``message``'s fields in protobuf's text format, laid out as Triton's examples are."""
    pad = " " * indent
    for field, value in message.ListFields():
        if field.message_type is None:
            yield pad + _scalar_field(field, value)
        elif field.is_repeated and not field.message_type.GetOptions().map_entry:
            one = f"{pad}{field.name} [ {', '.join(_inline(m) for m in value)} ]"
            if indent and len(one) <= _WIDTH:
                yield one
                continue
            yield f"{pad}{field.name} ["
            blocks = [_block("", m, indent + 2) for m in value]
            for number, block in enumerate(blocks):
                yield from block[:-1]
                yield block[-1] + ("," if number < len(blocks) - 1 else "")
            yield f"{pad}]"
        else:
            for item in _items(field, value):
                yield from _block(f"{field.name} ", item, indent)
