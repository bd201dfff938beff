"""The data plane: what V1, V2 and the activation routes share.

It owns the loaded repository and activation sessions, looks models up, and runs inference off
the event loop. The routes only translate HTTP to and from the calls here.
"""

from __future__ import annotations

import json

import anyio.to_thread
import numpy as np

from service.activations import ACTIVATIONS, ActivationEvaluator
from service.batching import Batcher
from service.errors import NotFoundError, NotReadyError
from service.metrics import Metrics
from service.runtime import Model, ModelRepository
from service.settings import Settings


class DataPlane:
    """Models, activations and inference, independent of any wire protocol."""

    def __init__(
        self,
        settings: Settings,
        repository: ModelRepository,
        activations: ActivationEvaluator,
        metrics: Metrics,
    ) -> None:
        self.settings = settings
        self.repository = repository
        self.activations = activations
        self.metrics = metrics
        self.batchers: dict[tuple[str, str], Batcher] = {}
        for model in repository.all():
            for provider in model.providers:
                metrics.providers.labels(model.name, model.version, provider).set(1)

    async def start(self) -> None:
        """Start a batcher for every model version that batches; call on the event loop."""
        settings = self.settings
        for model in self.repository.all():
            config = model.config
            if not (settings.batching and config.dynamic_batching):
                continue
            delay = settings.max_queue_delay_us
            if delay is None:
                delay = config.max_queue_delay_us or 0
            size = settings.batch_max_size or config.max_batch_size
            batcher = Batcher(model, size, delay, self.metrics)
            batcher.start()
            self.batchers[model.name, model.version] = batcher

    async def stop(self) -> None:
        """Stop every batcher."""
        for batcher in self.batchers.values():
            await batcher.stop()
        self.batchers.clear()

    @property
    def ready(self) -> bool:
        return all(m.ready for m in self.repository.all())

    def model(self, name: str, version: str | None = None) -> Model:
        """A ready model, or 404 / 503."""
        model = self.repository.get(name, version)
        if not model.ready:
            raise NotReadyError(f"model {name!r} version {model.version} is not ready")
        return model

    def max_batch(self, model: Model) -> int:
        """The largest batch one request may carry for ``model``."""
        return self.settings.max_request_batch or model.config.max_batch_size

    async def infer(
        self, model: Model, inputs: dict[str, np.ndarray], outputs: list[str] | None = None
    ) -> dict[str, np.ndarray]:
        """Run ``model`` through its batcher, or alone in a worker thread (onnxruntime
        releases the GIL)."""
        batcher = self.batchers.get((model.name, model.version))
        if batcher is not None:
            return await batcher.infer(inputs, outputs)
        batch = len(next(iter(inputs.values())))
        self.metrics.batch_size.labels(model.name).observe(batch)
        return await anyio.to_thread.run_sync(model.infer, inputs, outputs)

    def check_activation(self, name: str) -> None:
        """404 for an activation that does not exist."""
        if name not in ACTIVATIONS:
            raise NotFoundError(f"unknown activation {name!r}; available: {', '.join(ACTIVATIONS)}")

    async def activate(self, name: str, x: np.ndarray, derivative: bool) -> np.ndarray:
        """Evaluate activation ``name`` (or its derivative) elementwise, off the event loop."""
        self.check_activation(name)
        return await anyio.to_thread.run_sync(self.activations.evaluate, name, x, derivative)

    def summary(self, name: str) -> dict[str, object]:
        """A model's V1 description: versions, task, labels, tensors, providers, metrics."""
        latest = self.repository.get(name)
        meta = latest.metadata
        return {
            "name": name,
            "versions": list(self.repository.models[name]),
            "latest_version": latest.version,
            "ready": all(m.ready for m in self.repository.models[name].values()),
            "platform": latest.config.platform,
            "task": latest.task,
            "activation": meta.get("activation", ""),
            "arch": meta.get("arch", ""),
            "label_names": latest.label_names,
            "inputs": tensor_metadata(latest, inputs=True),
            "outputs": tensor_metadata(latest, inputs=False),
            "input_normalisation": json.loads(meta.get("input_normalisation", "{}")),
            "max_batch_size": self.max_batch(latest),
            "providers": latest.providers,
            "metrics": json.loads(meta.get("metrics", "{}")),
        }


def tensor_metadata(model: Model, inputs: bool) -> list[dict[str, object]]:
    """Tensors as the Open Inference Protocol describes them: -1 for the batch dimension."""
    tensors = model.config.inputs if inputs else model.config.outputs
    return [{"name": t.name, "datatype": t.datatype, "shape": [-1, *t.dims]} for t in tensors]
