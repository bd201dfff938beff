"""Model control, Triton's model repository extension: load, unload and the index, and the
model control modes that allow them. Who may call them is not decided here: every request's
credentials are checked in its face's envelope, before it reaches a route or method
(``service.auth``). A handler of its own over the live repository (as MLServer's
``handlers/model_repository.py``), apart from inference and not a part of the core: whoever
composes the service (``service.host.Host``, ``create_app`` alone, a Ray replica) builds one
over the core's repository (``ModelControl.over``) and hands it to each face, the HTTP face
serving it under ``/v2/repository`` and the gRPC face as ``Repository*``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING

from service.errors import BadInputError, LoadFailedError, ModelLoadError, NotReadyError
from service.repository import ModelRepository
from service.repository.demand import OnDemand
from service.settings import Settings

if TYPE_CHECKING:
    from service.dataplane import DataPlane

# Triton's answer to a load or unload outside explicit mode.
CONTROL_FORBIDDEN = "explicit model load / unload is not allowed if polling is enabled"


class ControlForbiddenError(NotReadyError):
    """Load and unload outside explicit mode (Triton answers 503 UNAVAILABLE)."""


class ModelControl:
    """Load, unload and index the models of ``repository()`` (503 while it is not started)."""

    def __init__(
        self,
        settings: Settings,
        repository: Callable[[], ModelRepository],
        on_demand: Callable[[], OnDemand | None] = lambda: None,
    ) -> None:
        self.settings = settings
        self._repository = repository
        self._on_demand = on_demand

    @classmethod
    def over(cls, core: DataPlane) -> ModelControl:
        """Control of ``core``'s repository while it is started (503 before and after), with
        its on_demand budget in that mode."""
        return cls(core.settings, core.started_repository, lambda: core.on_demand)

    async def index(self, ready_only: bool = False) -> list[dict[str, str]]:
        """Every model in the repository with its versions' states and reasons."""
        return await self._repository().index(ready_only)

    async def load(self, name: str, parameters: Iterable[str] = ()) -> None:
        """Load or reload ``name`` (explicit and on_demand modes), as its repository directory
        holds it; in on_demand mode within the budget, unloading the least recently used.
        ``parameters`` names the load request's parameters: Triton's overrides, ``config`` and
        ``file:<path>``, are refused rather than ignored (a client sending them expects the
        model they describe), in any case or padding (``FILE:``, `` config``: what a client or
        proxy may make of them); any other is ignored."""
        self._check_control()
        for key in parameters:
            named = key.strip().lower()
            if named == "config" or named.startswith("file:"):
                raise BadInputError(
                    f"load parameter {key!r} is not supported: a model loads from its directory "
                    "in the model repository (config.pbtxt and the version directories); change "
                    "the files there and load again"
                )
        repository, on_demand = self._repository(), self._on_demand()
        try:
            await (on_demand.load(name) if on_demand is not None else repository.load(name))
        except ModelLoadError as exc:  # whatever failed: the repository made it the refusal
            raise LoadFailedError(name, str(exc)) from None

    async def unload(self, name: str) -> None:
        """Stop serving ``name`` once its requests finish (explicit and on_demand modes)."""
        self._check_control()
        await self._repository().unload(name)
        on_demand = self._on_demand()
        if on_demand is not None:
            on_demand.record()

    def _check_control(self) -> None:
        if self.settings.model_control_mode not in ("explicit", "on_demand"):
            raise ControlForbiddenError(CONTROL_FORBIDDEN)
