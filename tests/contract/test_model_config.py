"""Triton's config.pbtxt, written by export and read by the service, through Triton's own
``model_config.proto``."""

from __future__ import annotations

import dataclasses

import pytest
from google.protobuf import descriptor_pool

from contract.model_config import (
    MAX_CONFIG_BYTES,
    MAX_CONFIG_DEPTH,
    ConfigParseError,
    EnsembleStep,
    ModelConfig,
    TensorConfig,
    VersionPolicy,
    Warmup,
    WarmupInput,
    load_model_config,
    parse_config,
)
from contract.names import ENSEMBLE_PLATFORM, PLATFORM

EXPORTED = ModelConfig(
    name="m",
    platform=PLATFORM,
    max_batch_size=64,
    inputs=(TensorConfig("input", "FP32", (1, 8, 8)),),
    outputs=(TensorConfig("logits", "FP32", (10,)),),
    dynamic_batching=True,
    max_queue_delay_us=250,
)


def test_config_pbtxt_round_trip() -> None:
    config = load_model_config(EXPORTED.to_pbtxt())
    assert config == EXPORTED
    assert config.name == "m" and config.platform == "onnxruntime_onnx"
    assert config.max_batch_size == 64 and config.max_queue_delay_us == 250
    assert config.inputs == (TensorConfig("input", "FP32", (1, 8, 8)),)
    assert config.outputs == (TensorConfig("logits", "FP32", (10,)),)


def test_every_field_of_the_view_is_written_and_read_back() -> None:
    full = dataclasses.replace(
        EXPORTED,
        name="café",  # UTF-8, written and read as such
        version_policy=VersionPolicy("specific", versions=(1, 3)),
        instance_count=3,
        warmups=(
            Warmup("w", 2, (WarmupInput("input", "FP32", (1, 8, 8), "file", "raw"),), 4),
            Warmup("z", 0, (WarmupInput("input", "FP16", (2,), "zero"),)),
        ),
        response_cache=True,
        cuda_graphs=(2, 8),
    )
    assert load_model_config(full.to_pbtxt()) == full
    assert load_model_config(full.to_pbtxt().encode()) == full
    ensemble = dataclasses.replace(
        EXPORTED,
        platform=ENSEMBLE_PLATFORM,
        dynamic_batching=False,
        max_queue_delay_us=None,
        version_policy=VersionPolicy("latest", 2),
        steps=(
            EnsembleStep("a", -1, (("input", "input"),), (("logits", "x"), ("y", "z"))),
            EnsembleStep("b", 3, (("q", "x"),), ()),
        ),
    )
    assert load_model_config(ensemble.to_pbtxt()) == ensemble
    with pytest.raises(ValueError, match="exclude each other"):  # Triton's scheduling_choice
        dataclasses.replace(ensemble, dynamic_batching=True).to_pbtxt()


def test_the_written_layout_is_tritons_examples() -> None:
    """One field a line at the top, short messages on one line, lists in brackets: what the
    repository's tests and people edit line by line."""
    text = EXPORTED.to_pbtxt()
    assert text.splitlines()[:4] == [
        'name: "m"',
        'platform: "onnxruntime_onnx"',
        "version_policy { all { } }",
        "max_batch_size: 64",
    ]
    assert '  { name: "input" data_type: TYPE_FP32 dims: [ 1, 8, 8 ] }' in text
    assert "dynamic_batching { max_queue_delay_microseconds: 250 }\n" in text
    assert parse_config(text) == EXPORTED.to_message()


def test_config_parser_handles_triton_syntax() -> None:
    text = """
    # a comment
    name: "x" platform: "onnxruntime_onnx"
    max_batch_size: 8
    input: [ { name: "a", data_type: TYPE_FP32, dims: [ 3 ] } ]
    input { name: "b" data_type: TYPE_INT64 dims: 2 dims: 2 }
    output [ { name: "y" data_type: TYPE_FP16 dims: [ -1 ] } ]
    instance_group [ { count: 2 kind: KIND_CPU } ]
    """
    config = load_model_config(text)
    assert [t.name for t in config.inputs] == ["a", "b"]
    assert config.inputs[1] == TensorConfig("b", "INT64", (2, 2))
    assert config.outputs[0].dims == (-1,) and not config.dynamic_batching
    for bad in ('name: "x', "input [ { name: 1 ", "{", 'name: "x" input { data_type: TYPE_X }'):
        with pytest.raises(ConfigParseError):
            load_model_config(bad)


def test_the_grammar_and_its_errors_are_tritons() -> None:
    """What Triton's protobuf parser refuses is refused, each error naming the file, line and
    column: an unknown field, a singular field given twice, two members of one oneof."""
    cases = {
        'name: "m"\nmax_batch_size: 8\nmax_batch_size: "x"\n': r"^config\.pbtxt:3:17: .*integer",
        'name: "m"\nnot_a_field: 1\n': r'^config\.pbtxt:2:1: .*no field named "not_a_field"',
        'name: "m"\nname: "n"\n': r'^config\.pbtxt:2:\d+: .*multiple "name" fields',
        "dynamic_batching { }\nensemble_scheduling { }\n": r"^config\.pbtxt:2:\d+: .*oneof",
        "max_batch_size: 99999999999999999\n": r"^config\.pbtxt:1:\d+: .*out of range",
    }
    for text, pattern in cases.items():
        with pytest.raises(ConfigParseError, match=pattern):
            load_model_config(text, "m")
    with pytest.raises(ConfigParseError, match=r"^digits/config\.pbtxt:1:\d+: "):
        load_model_config("name: ", source="digits/config.pbtxt")


def test_issue_62_item_3_every_mistake_is_one_config_parse_error(tmp_path) -> None:
    """Issue 62 item 3: `max_batch_size: "x"` raised ValueError, other mistakes TypeError or
    AttributeError, and 5,000 nested blocks RecursionError, all past ConfigParseError; "café"
    was read as "cafÃ©"."""
    text = EXPORTED.to_pbtxt()
    nested = "optimization { cuda { " + "graph_spec { " * 5000 + "}" * 5002
    mistakes = [
        text + 'max_batch_size: "x"\n',  # ValueError before
        text.replace("version_policy { all { } }", "version_policy: 5"),  # TypeError before
        text + "dynamic_batching: 5\n",  # AttributeError before
        text + "instance_group [ 3 ]\n",
        text + nested,  # RecursionError before
        "{" * 5000,
        text + 'input { name: "z" data_type: 99 }\n',  # a number no DataType names
    ]
    for mistake in mistakes:
        with pytest.raises(ConfigParseError, match=r"^config\.pbtxt:\d+"):
            load_model_config(mistake)
    with pytest.raises(ConfigParseError, match=f"nested deeper than {MAX_CONFIG_DEPTH} levels"):
        load_model_config(text + nested)
    path = tmp_path / "config.pbtxt"
    path.write_bytes('name: "café"\ninput [ { name: "größe" data_type: TYPE_FP32 } ]'.encode())
    config = load_model_config(path.read_bytes())
    assert config.name == "café" and config.inputs[0].name == "größe"
    assert load_model_config(r'name: "caf\303\251"').name == "café"  # octal escapes of UTF-8


def test_bounds_and_encoding() -> None:
    """The text is UTF-8 of at most MAX_CONFIG_BYTES; a str that cannot be UTF-8 is refused."""
    with pytest.raises(ConfigParseError, match=r"^config\.pbtxt:2:10: not UTF-8 \(byte 0xe9\)"):
        load_model_config(b'name: "m"\nxyz: "caf\xe9"')
    with pytest.raises(ConfigParseError, match=r"^config\.pbtxt:1:8: not UTF-8"):
        load_model_config('name: "\udc80"')
    padding = "# " + "x" * MAX_CONFIG_BYTES + "\n"
    with pytest.raises(ConfigParseError, match=f"more than {MAX_CONFIG_BYTES}"):
        load_model_config(padding + 'name: "m"')
    assert load_model_config(padding[: MAX_CONFIG_BYTES - 20] + '\nname: "m"').name == "m"
    depth = MAX_CONFIG_DEPTH
    brackets = 'name: "m"\n# { { {\nparameters { key: "{" value { string_value: "[[[" } }\n'
    assert load_model_config(brackets).unhonoured == ("parameters.{",)  # strings, comments skipped
    with pytest.raises(ConfigParseError, match=rf"^config\.pbtxt:1:{2 * depth + 1}: nested"):
        load_model_config("[ " * (depth + 1))


def test_a_mistake_in_the_view_names_its_line() -> None:
    base = 'name: "m"\nmax_batch_size: 4\n'
    cases = {
        'input [ { name: "a" data_type: TYPE_FP32 dims: [ 0 ] } ]': r":3: input 'a': dimension",
        'output { name: "y" data_type: TYPE_STRING }': r":3: output 'y': unsupported data_type",
        "input { data_type: TYPE_FP32 }": r":3: input 0: missing field 'name'",
        "instance_group { count: 1 }\ninstance_group { count: -2 }": r":4: instance_group: count",
        "optimization { cuda { graphs: true graph_spec [ { batch_size: 5 } ] } }": r":3: .*1\.\.4",
        "ensemble_scheduling { step { model_version: 1 } }": r":3: .*a step without model_name",
        'model_warmup { inputs { key: "x" value { data_type: TYPE_FP32 } } }': r":3: .*give one",
        "version_policy { }": r":3: version_policy must hold one of",
    }
    for text, pattern in cases.items():
        with pytest.raises(ConfigParseError, match=r"^config\.pbtxt" + pattern):
            load_model_config(f"{base}{text}\n")
    with pytest.raises(ConfigParseError, match=r"^config\.pbtxt: missing field 'name'"):
        load_model_config("max_batch_size: 1")
    with pytest.raises(ConfigParseError, match=r":1: max_batch_size -1 is negative"):
        load_model_config("max_batch_size: -1", "m")


def test_version_policy_and_instance_group() -> None:
    base = 'name: "m"\n'
    assert load_model_config(base).version_policy.select([1, 2, 3]) == [3]  # Triton's default
    policies = {
        "version_policy: { latest: { num_versions: 2 } }": [2, 3],
        "version_policy: { all: { } }": [1, 2, 3],
        "version_policy { specific { versions: [1, 3] } }": [1, 3],
    }
    for text, served in policies.items():
        config = load_model_config(base + text)
        assert config.version_policy.select([1, 2, 3]) == served
        assert load_model_config(config.to_pbtxt()).version_policy == config.version_policy
    groups = "instance_group [ { count: 2 kind: KIND_CPU }, { kind: KIND_CPU } ]"
    assert load_model_config(base + groups).instance_count == 3
    assert load_model_config(base).instance_count == 1
    # As Triton: a count of 0 is proto3's unset, the default of 1.
    assert load_model_config(base + "instance_group [ { count: 0 } ]").instance_count == 1
    for bad in ("version_policy: { newest: { } }", "instance_group [ { count: -1 } ]",
                "version_policy: { latest: { num_versions: 0 } }"):  # fmt: skip
        with pytest.raises(ConfigParseError):
            load_model_config(base + bad)


def test_fields_not_acted_on_are_named() -> None:
    base = EXPORTED.to_pbtxt()
    warmup = 'model_warmup { inputs { key: "input" value { data_type: TYPE_FP32 zero_data: 1 } } }'
    assert load_model_config(base + warmup).unhonoured == ()  # model_warmup is acted on
    others = 'parameters { key: "k" value { string_value: "v" } }\nmodel_transaction_policy { }\n'
    config = load_model_config(base + others)
    assert config.unhonoured == ("model_transaction_policy", "parameters.k")
    assert load_model_config(config.to_pbtxt()).unhonoured == ()  # not written back


def test_unset_is_read_as_triton_reads_it() -> None:
    """proto3 cannot tell 0 from unset: a warm-up count of 0 runs once, a step's version 0 is
    the latest, an empty dynamic_batching has no delay, a missing platform is onnxruntime's."""
    text = """
    max_batch_size: 2
    dynamic_batching { }
    model_warmup [ {
      inputs { key: "b" value { data_type: TYPE_FP32 random_data: true } }
      inputs { key: "a" value { data_type: TYPE_INT64 dims: [ 2 ] zero_data: true } }
    } ]
    """
    config = load_model_config(text, "dir")
    assert config.name == "dir" and config.platform == PLATFORM
    assert config.dynamic_batching and config.max_queue_delay_us == 0
    (warmup,) = config.warmups
    assert (warmup.name, warmup.count, warmup.batch_size) == ("warmup", 1, 0)
    assert warmup.inputs == (
        WarmupInput("a", "INT64", (2,), "zero"),
        WarmupInput("b", "FP32", (), "random"),
    )  # by name
    steps = load_model_config('name: "e" ensemble_scheduling { step { model_name: "x" } }').steps
    assert steps == (EnsembleStep("x", -1, (), ()),)


def test_tritons_messages_coexist_with_tritonclients_copy() -> None:
    """Both name their messages ``inference.*``: ours live in a private pool, and the bytes of
    one are the other's."""
    theirs = pytest.importorskip("tritonclient.grpc.model_config_pb2")
    from contract.triton import model_config_pb2 as ours

    assert ours.POOL is not descriptor_pool.Default()
    assert ours.DESCRIPTOR.pool is ours.POOL
    message = EXPORTED.to_message()
    copied = theirs.ModelConfig.FromString(message.SerializeToString())
    assert copied.input[0].dims == [1, 8, 8]
    assert ours.ModelConfig.FromString(copied.SerializeToString()) == message


def test_batch_invariant_is_a_model_parameter() -> None:
    """Triton's ``parameters`` map carries ``batch_invariant``: "rows" or "pad", "off" or
    absent for off; written back, and refused where it cannot act, on its line."""
    base = EXPORTED.to_pbtxt()
    assert load_model_config(base).batch_invariant == ""

    def given(value: str) -> str:
        return f'parameters {{ key: "batch_invariant" value {{ string_value: "{value}" }} }}\n'

    for value, read in (("rows", "rows"), ("pad", "pad"), ("off", "")):
        config = load_model_config(base + given(value))
        assert config.batch_invariant == read and config.unhonoured == ()
        assert load_model_config(config.to_pbtxt()) == config
    other = 'parameters { key: "k" value { string_value: "v" } }\n'
    assert load_model_config(base + given("pad") + other).unhonoured == ("parameters.k",)
    lines = base.count("\n") + 1
    with pytest.raises(ConfigParseError, match=rf":{lines}: .*'yes' is not one of off, rows, pad"):
        load_model_config(base + given("yes"))
    with pytest.raises(ConfigParseError, match=r"batch_invariant needs max_batch_size >= 1"):
        load_model_config('name: "m"\n' + given("rows"))
    ensemble = 'name: "e"\nplatform: "ensemble"\nmax_batch_size: 4\n'
    with pytest.raises(ConfigParseError, match=r"an ensemble runs nothing itself"):
        load_model_config(ensemble + given("pad"))
