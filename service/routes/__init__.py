"""HTTP faces over the data plane: V1 (KServe style), V2 (Open Inference Protocol), activations."""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Request

from service.dataplane import DataPlane


def _dataplane(request: Request) -> DataPlane:
    dataplane: DataPlane = request.app.state.dataplane
    return dataplane


Plane = Annotated[DataPlane, Depends(_dataplane)]
