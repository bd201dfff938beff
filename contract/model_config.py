"""Triton's ``config.pbtxt`` (protobuf text format) as a typed ``ModelConfig``, both ways.

Export writes it with ``ModelConfig.to_pbtxt()``; the service reads it with
``load_model_config()``. Only the subset a model repository for onnxruntime needs is
interpreted; the parser itself handles the whole text-format grammar of scalars, lists and
nested messages. Torch-free: the service imports it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

import numpy as np

from contract.names import PLATFORM

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

_TOKEN = re.compile(r'\s+|#[^\n]*|"(?:[^"\\]|\\.)*"|[{}\[\]:,;]|[^\s{}\[\]:,;"#]+')


class ConfigParseError(ValueError):
    """A config.pbtxt that is not valid text format or lacks what serving needs."""


def _tokenize(text: str) -> list[str]:
    tokens: list[str] = []
    pos = 0
    for match in _TOKEN.finditer(text):
        if match.start() != pos:
            break
        pos = match.end()
        token = match.group()
        if token.strip() and not token.startswith("#"):
            tokens.append(token)
    if pos != len(text):
        raise ConfigParseError(f"unexpected character {text[pos]!r} at offset {pos}")
    return tokens


def parse_pbtxt(text: str) -> dict[str, list[Any]]:
    """Parse protobuf text format into ``{field: [values...]}`` (every field may repeat)."""
    tokens = _tokenize(text)
    pos = 0

    def scalar(token: str) -> Any:
        if token.startswith('"'):
            return bytes(token[1:-1], "utf-8").decode("unicode_escape")
        for convert in (int, float):
            try:
                return convert(token)
            except ValueError:
                continue
        return {"true": True, "false": False}.get(token, token)

    def value() -> Any:
        nonlocal pos
        token = tokens[pos]
        pos += 1
        if token == "{":
            return message("}")
        if token in "}[]:,;":
            raise ConfigParseError(f"unexpected {token!r}")
        return scalar(token)

    def message(end: str | None) -> dict[str, list[Any]]:
        nonlocal pos
        fields: dict[str, list[Any]] = {}
        while pos < len(tokens) and tokens[pos] != end:
            name = tokens[pos]
            if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name):
                raise ConfigParseError(f"expected a field name, found {name!r}")
            pos += 1
            if tokens[pos] == ":":
                pos += 1
            values = fields.setdefault(name, [])
            if tokens[pos] == "[":
                pos += 1
                while tokens[pos] != "]":
                    values.append(value())
                    if tokens[pos] == ",":
                        pos += 1
                pos += 1
            else:
                values.append(value())
            if pos < len(tokens) and tokens[pos] in ",;":
                pos += 1
        if end is not None:
            if pos >= len(tokens):
                raise ConfigParseError(f"missing {end!r}")
            pos += 1
        return fields

    try:
        return message(None)
    except IndexError:
        raise ConfigParseError("unexpected end of text") from None


@dataclass(frozen=True)
class TensorConfig:
    """One input or output: name, V2 datatype and dims without the batch dimension."""

    name: str
    datatype: str
    dims: tuple[int, ...]

    @property
    def numpy_dtype(self) -> np.dtype:
        return V2_TO_NUMPY[self.datatype]

    def to_pbtxt(self) -> str:
        """This tensor as one entry of an ``input`` or ``output`` list."""
        return (
            f'  {{\n    name: "{self.name}"\n    data_type: {V2_TO_TRITON[self.datatype]}\n'
            f"    dims: [ {', '.join(str(d) for d in self.dims)} ]\n  }}"
        )


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

    def to_pbtxt(self) -> str:
        """The ``version_policy`` field."""
        if self.kind == "all":
            return "version_policy: { all: { } }"
        if self.kind == "specific":
            return f"version_policy: {{ specific: {{ versions: {list(self.versions)} }} }}"
        return f"version_policy: {{ latest: {{ num_versions: {self.num_versions} }} }}"


SERVE_ALL = VersionPolicy("all")


@dataclass(frozen=True)
class EnsembleStep:
    """One step of Triton's ``ensemble_scheduling``: a model (and version, -1: its latest) fed
    from the ensemble's tensors (``input_map``: the model's input -> an ensemble tensor), its
    outputs named as ensemble tensors (``output_map``: the model's output -> a tensor)."""

    model_name: str
    model_version: int
    input_map: tuple[tuple[str, str], ...]
    output_map: tuple[tuple[str, str], ...]

    def to_pbtxt(self) -> str:
        maps = [f'    {kind} {{ key: "{key}" value: "{value}" }}\n'
                for kind, pairs in (("input_map", self.input_map), ("output_map", self.output_map))
                for key, value in pairs]  # fmt: skip
        return (f'  {{\n    model_name: "{self.model_name}"\n'
                f"    model_version: {self.model_version}\n" + "".join(maps) + "  }")  # fmt: skip


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
    # Fields present in the file that the service reads but does not act on (Triton's
    # instance_group, model_warmup, parameters, ...): the service warns about each.
    unhonoured: tuple[str, ...] = ()
    instance_count: int = 1  # instance_group: runs of this model at once (counts summed)
    warmups: tuple[Warmup, ...] = ()  # model_warmup: run before a version is ready
    response_cache: bool = False  # response_cache { enable: true }: answers kept (Triton's)
    steps: tuple[EnsembleStep, ...] = ()  # platform "ensemble": its ensemble_scheduling
    # optimization { cuda { graphs: true graph_spec [...] } }: a CUDA graph per batch size
    cuda_graphs: tuple[int, ...] = ()

    def to_pbtxt(self) -> str:
        """The config.pbtxt text."""

        def tensors(field: str, specs: tuple[TensorConfig, ...]) -> str:
            return f"{field} [\n" + ",\n".join(t.to_pbtxt() for t in specs) + "\n]\n"

        text = (
            f'name: "{self.name}"\n'
            f'platform: "{self.platform}"\n'
            f"max_batch_size: {self.max_batch_size}\n"
            + self.version_policy.to_pbtxt()
            + "\n"
            + tensors("input", self.inputs)
            + tensors("output", self.outputs)
        )
        if self.dynamic_batching:
            delay = self.max_queue_delay_us or 0
            text += f"dynamic_batching {{\n  max_queue_delay_microseconds: {delay}\n}}\n"
        if self.cuda_graphs:
            specs = ", ".join(f"{{ batch_size: {b} }}" for b in self.cuda_graphs)
            text += f"optimization {{\n  cuda {{ graphs: true graph_spec [ {specs} ] }}\n}}\n"
        if self.steps:
            steps = ",\n".join(step.to_pbtxt() for step in self.steps)
            text += f"ensemble_scheduling {{\n step [\n{steps}\n ]\n}}\n"
        return text


def _one(fields: dict[str, list[Any]], key: str, default: Any = None) -> Any:
    values = fields.get(key)
    if not values:
        if default is None:
            raise ConfigParseError(f"missing field {key!r}")
        return default
    return values[-1]


def _tensor(fields: dict[str, list[Any]]) -> TensorConfig:
    data_type = _one(fields, "data_type")
    if data_type not in TRITON_TO_V2:
        raise ConfigParseError(f"unsupported data_type {data_type!r}")
    dims = tuple(int(d) for d in fields.get("dims", []))
    return TensorConfig(str(_one(fields, "name")), TRITON_TO_V2[data_type], dims)


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


def _instance_count(fields: dict[str, list[Any]]) -> int:
    """Triton's ``instance_group``: the counts of every group summed (a group's default 1)."""
    groups = fields.get("instance_group", [])
    count = sum(int(_one(group, "count", 1)) for group in groups) if groups else 1
    if count < 1:
        raise ConfigParseError("instance_group: count must be at least 1")
    return count


def _warmup_input(entry: dict[str, list[Any]]) -> WarmupInput:
    name = str(_one(entry, "key"))
    value = _one(entry, "value")
    data_type = _one(value, "data_type")
    if data_type not in TRITON_TO_V2:
        raise ConfigParseError(f"model_warmup input {name!r}: unsupported data_type {data_type!r}")
    dims = tuple(int(d) for d in value.get("dims", []))
    sources = [s for s in ("zero_data", "random_data", "input_data_file") if s in value]
    if len(sources) != 1:
        raise ConfigParseError(
            f"model_warmup input {name!r}: give one of zero_data, random_data, input_data_file"
        )
    source = sources[0]
    file = str(_one(value, source)) if source == "input_data_file" else ""
    kind = {"zero_data": "zero", "random_data": "random", "input_data_file": "file"}[source]
    return WarmupInput(name, TRITON_TO_V2[data_type], dims, kind, file)


def _warmups(fields: dict[str, list[Any]]) -> tuple[Warmup, ...]:
    """Triton's ``model_warmup``: the samples run before a version turns ready."""
    warmups = []
    for entry in fields.get("model_warmup", []):
        name = str(_one(entry, "name", "warmup"))
        count = int(_one(entry, "count", 1))
        batch_size = int(_one(entry, "batch_size", 0))
        if count < 1 or batch_size < 0:
            raise ConfigParseError(f"model_warmup {name!r}: count >= 1 and batch_size >= 0")
        inputs = tuple(_warmup_input(i) for i in entry.get("inputs", []))
        warmups.append(Warmup(name, batch_size, inputs, count))
    return tuple(warmups)


def _steps(fields: dict[str, list[Any]]) -> tuple[EnsembleStep, ...]:
    """Triton's ``ensemble_scheduling``'s steps, each map a tuple of (key, value) pairs."""

    def pairs(entries: list[dict[str, list[Any]]]) -> tuple[tuple[str, str], ...]:
        return tuple((str(_one(e, "key", "")), str(_one(e, "value", ""))) for e in entries)

    steps = []
    for step in _one(fields, "ensemble_scheduling", {}).get("step", []):
        name = str(_one(step, "model_name", ""))
        if not name:
            raise ConfigParseError("ensemble_scheduling: a step without model_name")
        version = int(_one(step, "model_version", -1))
        steps.append(EnsembleStep(name, version, pairs(step.get("input_map", [])),
                                  pairs(step.get("output_map", []))))  # fmt: skip
    return tuple(steps)


def _cuda_graphs(fields: dict[str, list[Any]], max_batch_size: int) -> tuple[int, ...]:
    """Triton's ``optimization { cuda { graphs: true graph_spec [{ batch_size: N }] } }``: the
    batch sizes to capture a CUDA graph for, each batch padded up to the next; without a
    graph_spec, every power of two up to max_batch_size, and max_batch_size itself."""
    cuda = _one(_one(fields, "optimization", {}), "cuda", {})
    if not _one(cuda, "graphs", False):
        return ()
    if max_batch_size < 1:
        raise ConfigParseError("optimization.cuda.graphs needs max_batch_size >= 1")
    sizes = []
    for spec in cuda.get("graph_spec", []):
        if set(spec) != {"batch_size"}:
            raise ConfigParseError("optimization.cuda.graph_spec: give batch_size alone")
        size = int(_one(spec, "batch_size"))
        if not 1 <= size <= max_batch_size:
            raise ConfigParseError(
                f"optimization.cuda.graph_spec: batch_size {size} is not in 1..{max_batch_size}"
            )
        sizes.append(size)
    if not sizes:
        sizes = [1 << k for k in range(max_batch_size.bit_length()) if 1 << k < max_batch_size]
        sizes.append(max_batch_size)
    return tuple(sorted(set(sizes)))


def _unhonoured(fields: dict[str, list[Any]]) -> tuple[str, ...]:
    """The fields present that the service does not act on; ``optimization`` counts as
    honoured when it holds only ``cuda``'s graphs."""
    left = set(fields) - INTERPRETED
    optimization = fields.get("optimization", [])
    if all(set(o) <= {"cuda"} for o in optimization) and all(
        set(c) <= {"graphs", "graph_spec"} for o in optimization for c in o.get("cuda", [])
    ):
        left.discard("optimization")
    return tuple(sorted(left))


def _version_policy(fields: dict[str, list[Any]]) -> VersionPolicy:
    policies = fields.get("version_policy")
    if not policies:
        return VersionPolicy()  # Triton's default: the latest version
    policy = policies[-1]
    if len(policy) != 1 or next(iter(policy)) not in ("latest", "all", "specific"):
        raise ConfigParseError("version_policy must hold one of latest, all, specific")
    kind, (body,) = next(iter(policy.items()))
    if kind == "latest":
        count = int(_one(body, "num_versions", 1))
        if count < 1:
            raise ConfigParseError("version_policy latest: num_versions must be at least 1")
        return VersionPolicy("latest", count)
    if kind == "specific":
        return VersionPolicy("specific", versions=tuple(int(v) for v in body.get("versions", [])))
    return SERVE_ALL


# The fields load_model_config interprets; any other is reported in ``unhonoured``.
INTERPRETED = frozenset(
    {"name", "platform", "backend", "max_batch_size", "input", "output", "dynamic_batching",
     "version_policy", "instance_group", "model_warmup", "response_cache",
     "ensemble_scheduling"}
)  # fmt: skip


def load_model_config(text: str, directory_name: str | None = None) -> ModelConfig:
    """Parse and interpret a config.pbtxt; ``ConfigParseError`` says what is wrong. As Triton,
    ``name`` may be left out: it is then the model's ``directory_name`` (ModelMesh's Triton
    adapter writes configs without one)."""
    fields = parse_pbtxt(text)
    batching = fields.get("dynamic_batching", [])
    delay = _one(batching[-1], "max_queue_delay_microseconds", -1) if batching else -1
    return ModelConfig(
        name=str(_one(fields, "name", directory_name)),
        platform=str(_one(fields, "platform", PLATFORM)),
        max_batch_size=int(_one(fields, "max_batch_size", 0)),
        inputs=tuple(_tensor(f) for f in fields.get("input", [])),
        outputs=tuple(_tensor(f) for f in fields.get("output", [])),
        dynamic_batching=bool(batching),
        max_queue_delay_us=int(delay) if delay >= 0 else None,
        version_policy=_version_policy(fields),
        unhonoured=_unhonoured(fields),
        instance_count=_instance_count(fields),
        warmups=_warmups(fields),
        response_cache=bool(_one(_one(fields, "response_cache", {}), "enable", False)),
        steps=_steps(fields),
        cuda_graphs=_cuda_graphs(fields, int(_one(fields, "max_batch_size", 0))),
    )
