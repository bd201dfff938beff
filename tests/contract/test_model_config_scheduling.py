"""``dynamic_batching``'s priority levels and queue policies in config.pbtxt: read through
Triton's ``model_config.proto``, refused at load in Triton's words where Triton refuses them,
and written back unchanged."""

from __future__ import annotations

import dataclasses

import pytest

from contract.model_config import (
    DELAY,
    REJECT,
    ConfigParseError,
    ModelConfig,
    QueuePolicy,
    SchedulingPolicy,
    TensorConfig,
    load_model_config,
)
from contract.names import PLATFORM

BASE = """name: "m"
max_batch_size: 8
input [ { name: "input" data_type: TYPE_FP32 dims: [ 64 ] } ]
output [ { name: "logits" data_type: TYPE_FP32 dims: [ 10 ] } ]
"""
TWO_LEVELS = """dynamic_batching {
  max_queue_delay_microseconds: 100
  priority_levels: 2
  default_priority_level: 2
  default_queue_policy { timeout_action: DELAY default_timeout_microseconds: 5000
                         allow_timeout_override: true max_queue_size: 16 }
  priority_queue_policy { key: 1 value: { max_queue_size: 4 } }
}
"""


def test_levels_and_policies_are_read_with_triton_names() -> None:
    config = load_model_config(BASE + TWO_LEVELS)
    assert config.unhonoured == ()
    assert config.scheduling == SchedulingPolicy(
        priority_levels=2,
        default_priority_level=2,
        default_queue_policy=QueuePolicy(DELAY, 5000, True, 16),
        priority_queue_policy=((1, QueuePolicy(REJECT, 0, False, 4)),),
    )


def test_a_config_without_a_policy_has_none() -> None:
    assert load_model_config(BASE + "dynamic_batching { }\n").scheduling is None
    assert load_model_config(BASE).scheduling is None
    # One level and no policy: nothing to schedule by (Triton ignores the default level then).
    one = BASE + "dynamic_batching { default_priority_level: 3 }\n"
    assert load_model_config(one).scheduling is None


def test_the_policy_is_written_back_unchanged() -> None:
    config = load_model_config(BASE + TWO_LEVELS)
    assert "priority_queue_policy" in config.to_pbtxt()
    assert load_model_config(config.to_pbtxt()) == config
    one_queue = dataclasses.replace(
        config, scheduling=SchedulingPolicy(default_queue_policy=QueuePolicy(max_queue_size=3))
    )
    assert load_model_config(one_queue.to_pbtxt()) == one_queue


def test_priorities_map_to_levels_as_triton_sets_them() -> None:
    """Triton's ``InferenceRequest::SetPriority``: 0, or one above the levels, is the default
    level; 1 is the highest."""
    scheduling = load_model_config(BASE + TWO_LEVELS).scheduling
    assert scheduling is not None and scheduling.levels == 2
    assert [scheduling.level(p) for p in (0, 1, 2, 3, 99)] == [2, 1, 2, 2, 2]
    one_queue = SchedulingPolicy(default_queue_policy=QueuePolicy())
    assert one_queue.levels == 1 and [one_queue.level(p) for p in (0, 1, 5)] == [1, 1, 1]


def test_each_level_has_its_own_policy_or_the_default() -> None:
    scheduling = load_model_config(BASE + TWO_LEVELS).scheduling
    assert scheduling is not None
    assert scheduling.policy(1) == QueuePolicy(max_queue_size=4)
    assert scheduling.policy(2) == QueuePolicy(DELAY, 5000, True, 16)
    # A level config.pbtxt gives no policy, where it writes no default: the server's (None).
    unwritten = SchedulingPolicy(2, 1, None, ((1, QueuePolicy(max_queue_size=2)),))
    assert unwritten.policy(2) is None and unwritten.policy(1) == QueuePolicy(max_queue_size=2)


def test_a_request_may_shorten_its_timeout_only_where_allowed() -> None:
    """Triton's ``PolicyQueue::Enqueue``: the default, or the request's own where
    ``allow_timeout_override`` is set and it is shorter; never longer."""
    strict = QueuePolicy(default_timeout_us=1000)
    assert strict.timeout_us(None) == 1000 and strict.timeout_us(10) == 1000
    lenient = QueuePolicy(default_timeout_us=1000, allow_timeout_override=True)
    assert lenient.timeout_us(10) == 10 and lenient.timeout_us(5000) == 1000
    assert lenient.timeout_us(0) == 1000 and lenient.timeout_us(None) == 1000
    # With no default timeout, Triton ignores a request's own, override or not.
    assert QueuePolicy(allow_timeout_override=True).timeout_us(10) == 0


@pytest.mark.parametrize(
    ("batching", "needle"),
    [
        ("priority_levels: 2", "default priority level must be in range [1, 2] for m"),
        ("priority_levels: 2 default_priority_level: 3",
         "default priority level must be in range [1, 2] for m"),
        ("priority_levels: 2 default_priority_level: 1 "
         "priority_queue_policy { key: 3 value: { } }",
         "priority queue policy must have priority level in range [1, 2] for m"),
        ("priority_levels: 2 default_priority_level: 1 "
         "priority_queue_policy { key: 0 value: { } }",
         "priority queue policy must have priority level in range [1, 2] for m"),
        ("priority_levels: 2 default_priority_level: 1 preserve_ordering: true",
         "Only one priority level is allowed when 'preserve_ordering' is true for m"),
        ("preserve_ordering: true default_queue_policy "
         "{ timeout_action: DELAY default_timeout_microseconds: 10 }",
         "Queue policy can not have DELAY as timeout action when 'preserve_ordering' is true"),
        ("default_queue_policy { timeout_action: 7 }",
         "default_queue_policy: timeout_action 7 is not REJECT or DELAY"),
        ("default_queue_policy { timeout_action: WAIT }", "has no value named WAIT"),
        ("default_queue_policy { max_queue_size: -1 }", "config.pbtxt:5"),
    ],
)  # fmt: skip
def test_a_policy_triton_refuses_is_refused_with_its_reason(batching: str, needle: str) -> None:
    with pytest.raises(ConfigParseError) as refused:
        load_model_config(BASE + f"dynamic_batching {{ {batching} }}\n")
    assert needle in str(refused.value)
    assert str(refused.value).startswith("config.pbtxt:5"), str(refused.value)  # its line


def test_per_level_policies_with_one_level_are_read_but_not_honoured() -> None:
    """As Triton: with ``priority_levels`` 0, only ``default_queue_policy`` is read."""
    config = load_model_config(
        BASE + "dynamic_batching { priority_queue_policy { key: 1 value: { } } }\n"
    )
    assert config.scheduling is None
    assert config.unhonoured == ("dynamic_batching.priority_queue_policy (priority_levels is 0)",)


def test_the_configuration_json_shows_the_policy_as_triton_does() -> None:
    scheduling = load_model_config(BASE + TWO_LEVELS).scheduling
    assert scheduling is not None
    assert scheduling.to_json() == {
        "priority_levels": 2,
        "default_priority_level": 2,
        "default_queue_policy": {
            "timeout_action": "DELAY",
            "default_timeout_microseconds": 5000,
            "allow_timeout_override": True,
            "max_queue_size": 16,
        },
        "priority_queue_policy": {
            "1": {
                "timeout_action": "REJECT",
                "default_timeout_microseconds": 0,
                "allow_timeout_override": False,
                "max_queue_size": 4,
            }
        },
    }


def test_the_written_view_holds_the_policy() -> None:
    config = ModelConfig(
        name="m",
        platform=PLATFORM,
        max_batch_size=8,
        inputs=(TensorConfig("input", "FP32", (64,)),),
        outputs=(TensorConfig("logits", "FP32", (10,)),),
        dynamic_batching=True,
        max_queue_delay_us=0,
        scheduling=SchedulingPolicy(3, 3, QueuePolicy(REJECT, 10, True, 2), ()),
    )
    text = config.to_pbtxt()
    assert "priority_levels: 3" in text and "allow_timeout_override: true" in text
    assert load_model_config(text) == config
