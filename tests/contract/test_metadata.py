"""The ONNX metadata export writes and the service reads back."""

from __future__ import annotations

import json

import pytest

from contract.metadata import ModelMetadata


def test_round_trip_through_metadata_props() -> None:
    written = ModelMetadata(
        name="m",
        version="2",
        task="classification",
        label_names=("cat", "dog"),
        input_normalisation={"divide_by": 16.0},
        metrics={"val_accuracy": 0.9},
        model_config={"arch": "mlp", "hidden": [8, 8]},
    )
    props = written.to_props()
    assert all(isinstance(v, str) for v in props.values())
    assert json.loads(props["label_names"]) == ["cat", "dog"]
    assert ModelMetadata.from_props(props) == written


def test_a_foreign_model_without_metadata_gets_defaults() -> None:
    metadata = ModelMetadata.from_props({"producer": "someone else"})
    assert metadata == ModelMetadata()
    assert metadata.label_names == () and metadata.task == ""


def test_malformed_json_is_a_value_error() -> None:
    with pytest.raises(ValueError):
        ModelMetadata.from_props({"label_names": "[oops"})
