"""The serving core: built, started and stopped with no web framework.

``DataPlane(settings)`` owns the model repository's sessions, the batchers, the activation
evaluator and the metrics. ``await start()`` loads, checks and warms every model version and
builds the activation graphs; ``await stop()`` drains the batchers. Every face (the FastAPI
app, a Ray Serve replica, the tests) builds one and translates its protocol to the calls here:
``infer``, ``activate``, ``model_info``. Requests are checked against the model here, once,
so every face gives the same answer to the same mistake.
"""

from __future__ import annotations

import gc
import logging

import anyio.to_thread
import numpy as np

from service.activations import ACTIVATIONS, ActivationEvaluator
from service.batching import Batcher
from service.codecs import cast
from service.errors import BadInputError, NotFoundError, NotReadyError, PayloadTooLargeError
from service.inference import (
    InferenceRequest,
    InferenceResult,
    ModelInfo,
    RequestInput,
    RequestOutput,
    TensorInfo,
)
from service.metrics import Metrics
from service.runtime import Model, ModelRepository, SessionFactory, session_options
from service.settings import Settings

logger = logging.getLogger("gelu_serve")


class DataPlane:
    """Models, activations and inference, independent of any wire protocol."""

    def __init__(self, settings: Settings, metrics: Metrics | None = None) -> None:
        self.settings = settings
        self.metrics = metrics or Metrics(settings.prometheus_multiproc_dir is not None)
        self.repository = ModelRepository({})
        self.batchers: dict[tuple[str, str], Batcher] = {}
        self._activations: ActivationEvaluator | None = None
        self._infos: dict[tuple[str, str], ModelInfo] = {}
        # The largest batch each version runs on the event loop (0: always on a thread).
        self._inline_batch: dict[tuple[str, str], int] = {}

    # ---- lifecycle ---------------------------------------------------------------------------

    async def start(self) -> None:
        """Load, check and warm every model version (off the event loop), build the activation
        graphs, start a batcher per batching version; ``StartupError`` says what is wrong."""
        settings = self.settings
        options = session_options(settings.intra_op_threads, settings.inter_op_threads)
        sessions = SessionFactory(settings.ort_providers, options, settings.strict_providers)
        self.repository = await anyio.to_thread.run_sync(
            ModelRepository.load, settings.model_repository, sessions, settings.warmup_runs
        )
        self._activations = await anyio.to_thread.run_sync(ActivationEvaluator, sessions)
        for model in self.repository.all():
            for provider in model.providers:
                self.metrics.providers.labels(model.name, model.version, provider).set(1)
            config = model.config
            batching = settings.batching and config.dynamic_batching
            size = (settings.batch_max_size or config.max_batch_size) if batching else 0
            inline_batch = await self._inline_limit(model, max(size, self.max_batch(model)))
            if batching:
                delay = settings.max_queue_delay_us
                if delay is None:
                    delay = config.max_queue_delay_us or 0
                # Inline batches stay within the bound; a larger request runs on a thread.
                size = min(size, inline_batch) if inline_batch else size
                batcher = Batcher(model, size, delay, self.metrics, inline=inline_batch > 0)
                batcher.start()
                self.batchers[model.name, model.version] = batcher
        # Described once: building it on every request would cost more than a small model's run.
        self._infos = {(m.name, m.version): self._describe(m) for m in self.repository.all()}
        # What start-up allocated lives as long as the process: keep the collector off it, so
        # collections under load scan only the requests' own objects (shorter GC pauses).
        gc.collect()
        gc.freeze()
        logger.info(
            "ready: %d model version(s) from %s, %d batching",
            len(self.repository.all()),
            settings.model_repository,
            len(self.batchers),
        )

    async def _inline_limit(self, model: Model, largest: int) -> int:
        """The largest batch of ``model`` that runs on the event loop: one whose run, timed
        here, takes at most ``GELU_INLINE_MAX_US``. Handing a run of a few microseconds to a
        thread costs more than the run; the loop blocks for at most the bound per run, and
        larger batches, or dearer models, go to a thread."""
        bound = self.settings.inline_max_us
        if not bound or not self.settings.warmup_runs:
            return 0
        limit, cost = await anyio.to_thread.run_sync(
            model.largest_batch_within, bound, max(largest, 1)
        )
        self._inline_batch[model.name, model.version] = limit
        logger.info(
            "%s/%s: batches up to %d run on the event loop (%s %.0f µs, bound %d µs)",
            model.name,
            model.version,
            limit,
            f"a batch of {limit} took" if limit else "one sample took",
            cost,
            bound,
        )
        return limit

    async def stop(self) -> None:
        """Stop every batcher; what is still queued fails. The core is not ready after."""
        self._activations = None
        for batcher in self.batchers.values():
            await batcher.stop()
        self.batchers.clear()
        self._inline_batch.clear()

    @property
    def ready(self) -> bool:
        """True between a successful ``start()`` and ``stop()``."""
        return self._activations is not None

    # ---- models --------------------------------------------------------------------------------

    def model_names(self) -> list[str]:
        """Every model the repository holds."""
        return list(self.repository.models)

    def model(self, name: str, version: str | None = None) -> Model:
        """A loaded model version (default: the latest), or 404; 503 before start."""
        if not self.ready:
            raise NotReadyError("the service is not ready: its models are not loaded")
        return self.repository.get(name, version)

    def max_batch(self, model: Model) -> int:
        """The largest batch one request may carry for ``model``."""
        return self.settings.max_request_batch or model.config.max_batch_size

    def model_info(self, name: str, version: str | None = None) -> ModelInfo:
        """Plain data about a model version, for the faces to describe it."""
        model = self.model(name, version)
        return self._infos[model.name, model.version]

    def _describe(self, model: Model) -> ModelInfo:
        meta, config = model.metadata, model.config
        return ModelInfo(
            name=model.name,
            version=model.version,
            versions=list(self.repository.models[model.name]),
            platform=config.platform,
            task=meta.task,
            arch=meta.arch,
            activation=meta.activation,
            label_names=meta.label_names,
            inputs=[TensorInfo(t.name, t.datatype, t.dims) for t in config.inputs],
            outputs=[TensorInfo(t.name, t.datatype, t.dims) for t in config.outputs],
            input_normalisation=meta.input_normalisation,
            metrics=meta.metrics,
            max_batch_size=self.max_batch(model),
            providers=model.providers,
            dynamic_batching=config.dynamic_batching,
            max_queue_delay_us=config.max_queue_delay_us,
            config_max_batch_size=config.max_batch_size,
        )

    # ---- inference -----------------------------------------------------------------------------

    async def infer(
        self, name: str, version: str | None, request: InferenceRequest
    ) -> InferenceResult:
        """Check ``request`` against the model, run it (batched when the model batches) and
        return the outputs asked for."""
        model = self.model(name, version)
        inputs = self._check_inputs(model, request.inputs)
        outputs = self._check_outputs(model, request)
        names = [o.name for o in outputs]
        key = model.name, model.version
        batch = len(next(iter(inputs.values())))
        inline = batch <= self._inline_batch.get(key, 0)
        batcher = self.batchers.get(key)
        if batcher is not None and inline is batcher.inline:
            results = await batcher.infer(inputs, names)
        else:
            self.metrics.batch_size.labels(model.name).observe(batch)
            if inline:
                results = model.infer(inputs, names)  # bounded: see _inline_limit
            else:
                # onnxruntime releases the GIL: the run proceeds beside the event loop.
                results = await anyio.to_thread.run_sync(model.infer, inputs, names)
        return InferenceResult(
            model=self._infos[model.name, model.version],
            outputs={n: results[n] for n in names},
            binary={o.name: o.binary for o in outputs},
            inputs=inputs,
            id=request.id,
        )

    def _check_inputs(self, model: Model, given: list[RequestInput]) -> dict[str, np.ndarray]:
        """Names, datatypes, shapes, batch sizes and limits against the model."""
        declared = model.input_configs
        inputs: dict[str, np.ndarray] = {}
        for tensor in given:
            if tensor.name is None:  # V1: the model's only input
                if len(declared) != 1:
                    raise BadInputError(
                        f"model {model.name!r} takes inputs {sorted(declared)}: name them (V2)"
                    )
                config = next(iter(declared.values()))
                array = cast(tensor.array, config.numpy_dtype, tensor.describe())
            else:
                config = declared.get(tensor.name)  # type: ignore[assignment]
                if config is None:
                    raise BadInputError(
                        f"unknown input {tensor.name!r} for model {model.name!r}; "
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
            if array.ndim >= 1 and len(array) == 0:
                raise BadInputError("empty batch: send at least one instance")
            if array.ndim == 0 or array.shape[1:] != config.dims:
                raise BadInputError(
                    f"{what}: shape {list(array.shape)} does not match the model's "
                    f"[-1, {', '.join(map(str, config.dims))}] (each instance must have shape "
                    f"{list(config.dims)})"
                )
            maximum = self.max_batch(model)
            if maximum and len(array) > maximum:
                raise PayloadTooLargeError(
                    f"batch of {len(array)} is above the maximum of {maximum}"
                )
            inputs[config.name] = array
        missing = [n for n in declared if n not in inputs]
        if missing:
            raise BadInputError(f"missing input(s) {missing} for model {model.name!r}")
        if len({len(a) for a in inputs.values()}) > 1:
            raise BadInputError("inputs have different batch sizes")
        return inputs

    @staticmethod
    def _check_outputs(model: Model, request: InferenceRequest) -> list[RequestOutput]:
        if request.outputs is None:
            return [RequestOutput(n, request.binary_outputs) for n in model.output_names]
        for output in request.outputs:
            if output.name not in model.output_names:
                raise BadInputError(
                    f"unknown output {output.name!r} for model {model.name!r}; "
                    f"expected {model.output_names}"
                )
        return request.outputs

    # ---- activations ---------------------------------------------------------------------------

    def activation_formulas(self) -> list[tuple[str, str, str]]:
        """(name, formula, derivative's formula) of every activation."""
        return [(a.name, a.formula, a.derivative_formula) for a in ACTIVATIONS.values()]

    def activation_providers(self) -> list[str]:
        """The execution providers the activation graphs run on."""
        return self._evaluator().providers

    def check_activation(self, name: str) -> None:
        """404 for an activation that does not exist."""
        if name not in ACTIVATIONS:
            raise NotFoundError(f"unknown activation {name!r}; available: {', '.join(ACTIVATIONS)}")

    async def activate(self, name: str, x: np.ndarray, derivative: bool = False) -> np.ndarray:
        """Evaluate activation ``name`` (or its derivative) elementwise, off the event loop."""
        evaluator = self._evaluator()
        self.check_activation(name)
        limit = self.settings.max_activation_elements
        if x.size > limit:
            raise PayloadTooLargeError(
                f"array of {x.size} values is above the maximum of {limit} "
                "(GELU_MAX_ACTIVATION_ELEMENTS)"
            )
        return await anyio.to_thread.run_sync(evaluator.evaluate, name, x, derivative)

    def _evaluator(self) -> ActivationEvaluator:
        if self._activations is None:
            raise NotReadyError("the service is not ready: the activation graphs are not built")
        return self._activations
