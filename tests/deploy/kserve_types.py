"""An InferenceService checked against KServe's own types, the kserve SDK's models (generated
from KServe's OpenAPI), strictly: unknown fields, wrong types and missing required fields are
errors. ``python -m tests.deploy.kserve_types FILE`` prints ``ok`` or the error (exit 1).

It runs in its own process: kserve registers the protocol's ``inference.*`` protobuf names in
protobuf's default pool, as tritonclient.grpc does, and one process cannot import both.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import yaml


def check_kserve(value: Any, kind: str, where: str = "") -> None:
    """``value`` against a type of KServe's SDK models (``openapi_types``), strictly: unknown
    fields, wrong types and missing required fields are errors (``ValueError``)."""
    if kind.startswith("List["):  # the SDKs' generators spell containers two ways
        kind = "list[" + kind[5:]
    elif kind.startswith("Dict["):
        kind = "dict(" + kind[5:-1] + ")"
    if kind in ("str", "datetime", "bytes"):
        ok = isinstance(value, str)
    elif kind == "int":
        ok = isinstance(value, int) and not isinstance(value, bool)
    elif kind == "bool":
        ok = isinstance(value, bool)
    elif kind in ("float", "ResourceQuantity"):  # a quantity: "500m", "1Gi" or a number
        ok = isinstance(value, int | float | str) and not isinstance(value, bool)
    elif kind == "float":
        ok = isinstance(value, int | float) and not isinstance(value, bool)
    elif kind == "object":
        ok = True
    elif kind.startswith("list["):
        if not isinstance(value, list):
            raise ValueError(f"{where}: expected a list")
        for i, item in enumerate(value):
            check_kserve(item, kind[5:-1], f"{where}[{i}]")
        return
    elif kind.startswith("dict("):
        if not isinstance(value, dict):
            raise ValueError(f"{where}: expected a mapping")
        inner = kind[5:-1].split(", ", 1)[1]
        for key, item in value.items():
            check_kserve(item, inner, f"{where}.{key}")
        return
    else:
        check_model(value, kind, where)
        return
    if not ok:
        raise ValueError(f"{where}: {value!r} is not of type {kind}")


def check_model(value: Any, kind: str, where: str) -> None:
    import kserve.models
    import kubernetes.client.models

    model = getattr(kserve.models, kind, None) or getattr(kubernetes.client.models, kind)
    if not isinstance(value, dict):
        raise ValueError(f"{where}: expected an object ({kind})")
    fields = {wire: attribute for attribute, wire in model.attribute_map.items()}
    for key, item in value.items():
        if key not in fields:
            raise ValueError(f"{where}.{key}: unknown field of {kind}")
        check_kserve(item, model.openapi_types[fields[key]], f"{where}.{key}")
    model(**{fields[k]: v for k, v in value.items()})  # required fields, enumerations


def main() -> None:
    document = yaml.safe_load(Path(sys.argv[1]).read_text())
    try:
        check_kserve(document, "V1beta1InferenceService", "InferenceService")
    except ValueError as exc:
        print(exc)
        sys.exit(1)
    print("ok")


if __name__ == "__main__":
    main()
