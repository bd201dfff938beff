"""Service settings: every one from a ``GELU_`` environment variable (pydantic-settings)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated, Literal, get_args

from pydantic import Field, SecretStr, ValidationError, field_validator, model_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

# Short names accepted in GELU_PROVIDERS, and the onnxruntime execution providers they mean.
PROVIDER_NAMES = {
    "cpu": "CPUExecutionProvider",
    "cuda": "CUDAExecutionProvider",
    "tensorrt": "TensorrtExecutionProvider",
}
MIB = 1 << 20
ENV_PREFIX = "GELU_"
# The fewest characters a credential (GELU_CONTROL_TOKEN, a key of GELU_RESTRICTED_API) may have.
MIN_KEY_CHARS = 16


class SettingsError(ValueError):
    """Invalid settings; the message names each ``GELU_*`` variable at fault, on one line."""


class Settings(BaseSettings):
    """Configuration of one service process. Invalid values stop the service at start-up."""

    model_config = SettingsConfigDict(env_prefix=ENV_PREFIX, protected_namespaces=())

    model_repository: Path = Field(
        Path("model_repository"),
        description="Root of the Triton-layout model repository: <model>/<version>/model.onnx.",
    )
    providers: Annotated[list[str], NoDecode] = Field(
        ["cpu"],
        description="Execution providers in order of preference, comma-separated: cpu, cuda, "
        "tensorrt (for example 'cuda,cpu').",
    )
    strict_providers: bool = Field(
        False,
        description="Refuse to start when onnxruntime falls back from a requested provider "
        "(for example CUDA that cannot load) instead of only logging it.",
    )
    cuda_device_id: int = Field(
        0, ge=0, description="CUDA provider: the GPU the sessions run on (onnxruntime's device_id)."
    )
    cuda_tf32: bool = Field(
        False,
        description="CUDA provider: let float32 matrix products round to TF32 on Ampere and "
        "later GPUs (onnxruntime's use_tf32, on in onnxruntime by default). Off, CUDA answers "
        "match the CPU's within 1e-5; on is faster and about 1e-2 off on logits.",
    )
    cuda_gpu_mem_limit: int = Field(
        0,
        ge=0,
        description="CUDA provider: the bytes its memory arena may hold on the GPU "
        "(onnxruntime's gpu_mem_limit); 0: no limit.",
    )
    cuda_arena_extend_strategy: Literal["kNextPowerOfTwo", "kSameAsRequested"] = Field(
        "kNextPowerOfTwo",
        description="CUDA provider: how its memory arena grows (onnxruntime's "
        "arena_extend_strategy).",
    )
    cuda_cudnn_conv_algo_search: Literal["EXHAUSTIVE", "HEURISTIC", "DEFAULT"] = Field(
        "EXHAUSTIVE",
        description="CUDA provider: how cuDNN convolution algorithms are chosen (onnxruntime's "
        "cudnn_conv_algo_search).",
    )
    cuda_do_copy_in_default_stream: bool = Field(
        True,
        description="CUDA provider: copy tensors to and from the GPU on the default stream "
        "(onnxruntime's do_copy_in_default_stream).",
    )
    cuda_io_binding: bool = Field(
        False,
        description="CUDA provider: run batches through onnxruntime's I/O binding (inputs "
        "bound from host memory, outputs read back from the GPU) instead of its plain run; "
        "slower on an H200 (docs/serving.md). CUDA graphs (config.pbtxt's "
        "optimization.cuda.graphs) bind their fixed buffers either way.",
    )
    intra_op_threads: int = Field(
        1,
        ge=0,
        description="onnxruntime intra-op threads per session (0: one per core). One suits "
        "small networks, which gain nothing from more; the service scales with workers.",
    )
    inter_op_threads: int = Field(
        1, ge=0, description="onnxruntime inter-op threads per session (0: one per core)."
    )
    op_thread_spinning: bool = Field(
        False,
        description="onnxruntime's intra- and inter-op threads spin for work after each run "
        "(its session.intra_op.allow_spinning and session.inter_op.allow_spinning, on in "
        "onnxruntime by default) instead of sleeping. Off, they take no core from the event "
        "loop and the other models; it matters only with more than one thread per session, "
        "where spinning doubled the server's CPU per request (docs/performance.md, Many "
        "models).",
    )
    inline_max_us: int = Field(
        500,
        ge=0,
        description="Batches that run within this many microseconds (timed at start-up) run on "
        "the event loop instead of a worker thread; 0: always a thread.",
    )
    compile_activations: bool = Field(
        True,
        description="Compile the activation endpoint's accurate kernel for this CPU (LLVM, "
        "about 0.2 s at start-up; used when the providers are the CPU's alone); false: run its "
        "float64 graphs on onnxruntime.",
    )
    grpc_port: int = Field(
        8001,
        ge=0,
        le=65535,
        description="Port of the gRPC face (the Open Inference Protocol's GRPCInferenceService, "
        "health and reflection), beside HTTP in the same process; 0 turns it off.",
    )
    grpc_host: str | None = Field(
        None,
        description="Address the gRPC face binds; unset: the HTTP face's (`gelu-serve serve "
        "--host`), else 127.0.0.1.",
    )
    grpc_max_streams_per_connection: int = Field(
        16,
        gt=0,
        description="Streaming gRPC calls (ModelStreamInfer, reflection, health's Watch) one "
        "connection may hold open at once; one more is refused (RESOURCE_EXHAUSTED). All "
        "connections' streams together are held to GELU_MAX_CONNECTIONS, apart from unary "
        "calls, so streams never take the calls other clients' unary ones need.",
    )
    grpc_stream_idle_seconds: float = Field(
        60.0,
        gt=0,
        description="A gRPC stream of requests (ModelStreamInfer, reflection) with none in "
        "progress that sends none for this long is ended (DEADLINE_EXCEEDED), as a proxy's read "
        "timeout does (nginx's grpc_read_timeout, 60 s); its connection, idle then, is closed "
        "after GELU_KEEP_ALIVE_SECONDS. Silent streams cannot hold every connection.",
    )
    tls_cert_file: Path | None = Field(
        None,
        description="PEM certificate (chain) both faces serve TLS with; unset: plaintext. "
        "Replaced files are read again while serving (HTTP within a second, gRPC at the next "
        "handshake).",
    )
    tls_key_file: Path | None = Field(
        None, description="PEM private key of GELU_TLS_CERT_FILE (both, or neither)."
    )
    tls_client_ca_file: Path | None = Field(
        None, description="PEM CA(s) whose client certificates are accepted (mutual TLS)."
    )
    tls_client_auth: Literal["none", "optional", "required"] = Field(
        "none",
        description="Client certificates: none asked; optional (checked when sent); required "
        "(a handshake without one fails). optional and required need GELU_TLS_CLIENT_CA_FILE.",
    )
    tls_probe_cert_file: Path | None = Field(
        None,
        description="A client certificate and its key (one PEM) that `gelu-serve health` "
        "presents, for health probes under GELU_TLS_CLIENT_AUTH=required.",
    )
    model_verify_key: Path | None = Field(
        None,
        description="A PEM public key: every model version must carry <version>/model.sig, an "
        "OpenSSF model signature of its directory made with the matching private key, or it "
        "is not loaded (start-up, load, poll). Needs the [signing] extra.",
    )
    response_cache_bytes: int = Field(
        0,
        ge=0,
        description="Triton's response cache: the bytes this process keeps of the answers of "
        "models whose config.pbtxt has response_cache { enable: true }, least recently used "
        "evicted first; 0 turns it off.",
    )
    max_body_bytes: int = Field(
        64 * MIB,
        gt=0,
        description="Largest request body accepted (binary forms, and gzip or deflate bodies "
        "after decompression); larger ones get 413. Also the largest gRPC message accepted "
        "(RESOURCE_EXHAUSTED beyond).",
    )
    max_json_bytes: int = Field(
        8 * MIB,
        gt=0,
        description="Largest JSON accepted: a JSON body, or the JSON header of a V2 binary "
        "request; larger ones get 413 before they are read. Parsing costs about 15 times the "
        "JSON's size in memory: send large tensors in the binary forms.",
    )
    max_header_bytes: int = Field(
        16 * 1024,
        ge=1024,
        description="Largest request line plus headers; larger ones get 431 and the "
        "connection is closed.",
    )
    max_headers: int = Field(
        100, ge=8, description="Most header fields in a request; more get 431."
    )
    max_connections: int = Field(
        1024,
        gt=0,
        description="Open connections per server process and face; one more gets 503 with "
        "Retry-After and is closed (gRPC: closed before its handshake). gRPC's calls in flight "
        "are bounded alike: as many unary calls, and as many streams again "
        "(RESOURCE_EXHAUSTED beyond).",
    )
    keep_alive_seconds: float = Field(
        5.0,
        gt=0,
        description="An idle connection (before its first request, or between requests; gRPC: "
        "no call in flight) is closed after this long.",
    )
    header_timeout_seconds: float = Field(
        10.0,
        gt=0,
        description="From a request's first byte to the end of its headers; slower gets 408 "
        "and the connection is closed. Also bounds a TLS handshake (both faces) and gRPC's HTTP/2 "
        "handshake.",
    )
    body_timeout_seconds: float = Field(
        30.0,
        gt=0,
        description="From the end of a request's headers to the end of its body; slower gets "
        "408 and the connection is closed (gRPC: a call's one message, DEADLINE_EXCEEDED). "
        "Behind Ray Serve's proxy, from when the replica asks for the body: 408, the "
        "connection Ray's.",
    )
    max_queue_size: int = Field(
        256,
        gt=0,
        description="Requests queued or running per model version; one more gets 503 with "
        "Retry-After (Triton's max_queue_size, counted with the running batch).",
    )
    default_timeout_us: int = Field(
        10_000_000,
        ge=0,
        description="How long a request may wait in a model's queue, in microseconds, unless "
        "it sets the V2 'timeout' parameter or its model's config.pbtxt gives its priority "
        "level a queue policy (docs/scheduling.md); past it, 503 with Retry-After instead of "
        "running late (Triton's default_timeout_microseconds); 0: no limit.",
    )
    drain_seconds: float = Field(
        5.0,
        ge=0,
        description="On SIGTERM, readiness turns 503 at once and the service keeps serving for "
        "this long (so load balancers stop sending), then stops accepting connections; SIGINT "
        "skips it.",
    )
    graceful_shutdown_seconds: float = Field(
        20.0,
        gt=0,
        description="After the drain, how long in-flight and queued requests may take to "
        "finish; then the rest are cancelled and the process exits.",
    )
    max_request_batch: int = Field(
        0,
        ge=0,
        description="Largest batch per request; 0 uses each model's config.pbtxt max_batch_size.",
    )
    max_activation_elements: int = Field(
        16 * MIB,
        gt=0,
        description="Largest array accepted by the activation endpoint, in elements.",
    )
    batching: bool = Field(
        True,
        description="Dynamic batching for models whose config.pbtxt has a dynamic_batching "
        "block; false turns it off everywhere.",
    )
    batch_max_size: int | None = Field(
        None,
        gt=0,
        description="Samples per batched run for every model; unset uses each config.pbtxt "
        "max_batch_size.",
    )
    max_queue_delay_us: int | None = Field(
        None,
        ge=0,
        description="How long a batch waits for more requests, in microseconds, for every "
        "model; unset uses each config.pbtxt max_queue_delay_microseconds.",
    )
    model_control_mode: Literal["none", "poll", "explicit", "on_demand"] = Field(
        "none",
        description="As Triton's --model-control-mode: none loads every model at start and "
        "never changes them; poll also re-scans the repository every "
        "GELU_REPOSITORY_POLL_SECONDS; explicit loads GELU_LOAD_MODELS at start, then only "
        "the repository API loads and unloads. on_demand loads GELU_PINNED_MODELS at start and "
        "any other model at its first inference request, unloading the least recently used "
        "when GELU_MAX_LOADED_MODELS or GELU_MODEL_MEMORY_BYTES would be exceeded; the "
        "repository API loads and unloads too.",
    )
    max_loaded_models: int = Field(
        0,
        ge=0,
        description="on_demand: at most this many models loaded at once (0: no bound); the "
        "least recently used is unloaded to make room. Ensembles hold no session and are not "
        "counted.",
    )
    model_memory_bytes: int = Field(
        0,
        ge=0,
        description="on_demand: the loaded models' sessions hold at most this many bytes (0: no "
        "bound), each measured as the process's resident memory grew while its sessions "
        "opened, never less than its model files (freed memory is reused).",
    )
    pinned_models: Annotated[list[str], NoDecode] = Field(
        [],
        description="on_demand: models loaded at start and never unloaded to make room, "
        "comma-separated.",
    )
    repository_poll_seconds: float = Field(
        15.0, gt=0, description="Seconds between repository scans in poll mode."
    )
    load_models: Annotated[list[str], NoDecode] = Field(
        [],
        description="Explicit mode: the models to load at start, comma-separated; * for all.",
    )
    control_token: SecretStr | None = Field(
        None,
        description="When set, the repository, trace and logging APIs need the header "
        "'Authorization: Bearer <token>' (401 without it), unless GELU_RESTRICTED_API "
        "restricts them otherwise; unset, any client that reaches the port may load and "
        "unload models. At least 16 characters, or the service does not start.",
    )
    restricted_api: SecretStr | None = Field(
        None,
        description="Route classes restricted to a header carrying a key, as Triton's "
        "--http-restricted-api, on both faces: ';'-separated groups "
        "'<class>[,<class>]:<header>=<key>[|<key>]', a key being file:PATH (a key per line), "
        "env:NAME or itself. Classes: inference, metadata, health, metrics, model-repository, "
        "statistics, trace, logging. 401 without a key, 403 with another class's. Each key "
        "at least 16 characters, or the service does not start.",
    )
    strict_model_config: bool = Field(
        False,
        description="As Triton's --strict-model-config: true needs a config.pbtxt for every "
        "model; false derives a missing one from the highest version's ONNX file.",
    )
    default_max_batch_size: int = Field(
        4,
        ge=1,
        description="max_batch_size of a derived config when the model has a batch axis (its "
        "first dimension symbolic in every tensor), as Triton's default-max-batch-size.",
    )
    exit_on_error: bool = Field(
        True,
        description="As Triton's --exit-on-error: refuse to start when a model fails to load; "
        "false starts with the models that load and reports the rest unavailable (the server "
        "not ready while GELU_STRICT_READINESS holds).",
    )
    strict_readiness: bool = Field(
        True,
        description="As Triton's --strict-readiness: true reports ready only when every model "
        "the control mode names serves; false, as soon as the service has started (until a "
        "drain), whatever models load. Each model's own ready answer is unchanged.",
    )
    warmup_runs: int = Field(
        2, ge=0, description="Inference runs per model at start-up, before readiness turns true."
    )
    log_format: Literal["default", "ISO8601", "json"] = Field(
        "default",
        description="Log lines as text (default), text with ISO 8601 UTC times (ISO8601, as "
        "Triton's), or one JSON object per line (json: time, level, message, request id, "
        "model, version, status, duration). Changeable at run time: POST /v2/logging.",
    )
    access_log: bool = Field(
        False,
        description="One log line per request on both faces (method, path, status, duration, "
        "model, version, request id); off by default, as each line costs the request path.",
    )
    log_level: Literal["critical", "error", "warning", "info", "debug"] = Field(
        "info",
        description="Log level of the service and uvicorn; at debug, a start-up refusal also "
        "logs its traceback.",
    )
    workers: int = Field(
        1,
        ge=1,
        description="Server processes for `gelu-serve serve` (its --workers overrides); each "
        "loads every model.",
    )
    prometheus_multiproc_dir: Path | None = Field(
        None,
        validation_alias="PROMETHEUS_MULTIPROC_DIR",
        description="prometheus_client's multiprocess directory (its own variable, no GELU_ "
        "prefix); `serve` makes a temporary one when workers > 1 and this is unset. Each worker "
        "writes its samples there once a second (metrics.FLUSH_SECONDS).",
    )

    @field_validator("log_level", mode="before")
    @classmethod
    def _lower_log_level(cls, value: object) -> object:
        return value.lower() if isinstance(value, str) else value

    @field_validator("load_models", "pinned_models", mode="before")
    @classmethod
    def _split_models(cls, value: object) -> object:
        if isinstance(value, str):
            return [part.strip() for part in value.split(",") if part.strip()]
        return value

    @model_validator(mode="after")
    def _budget(self) -> Settings:
        if self.max_loaded_models and len(self.pinned_models) > self.max_loaded_models:
            raise ValueError(
                f"GELU_PINNED_MODELS names {len(self.pinned_models)} models, more than "
                f"GELU_MAX_LOADED_MODELS={self.max_loaded_models}"
            )
        return self

    @model_validator(mode="after")
    def _tls_files(self) -> Settings:
        if (self.tls_cert_file is None) != (self.tls_key_file is None):
            raise ValueError("GELU_TLS_CERT_FILE and GELU_TLS_KEY_FILE: set both, or neither")
        if self.tls_client_auth != "none" and self.tls_client_ca_file is None:
            raise ValueError(
                f"GELU_TLS_CLIENT_AUTH={self.tls_client_auth} needs GELU_TLS_CLIENT_CA_FILE"
            )
        if self.tls_client_ca_file is not None and self.tls_cert_file is None:
            raise ValueError("GELU_TLS_CLIENT_CA_FILE needs GELU_TLS_CERT_FILE and _KEY_FILE")
        files = ("tls_cert_file", "tls_key_file", "tls_client_ca_file", "tls_probe_cert_file",
                 "model_verify_key")  # fmt: skip
        for name in files:
            path = getattr(self, name)
            if path is not None and not path.is_file():
                raise ValueError(f"{self.variable(name)}={path}: no such file")
        return self

    @field_validator("control_token")
    @classmethod
    def _long_token(cls, value: SecretStr | None) -> SecretStr | None:
        if value is not None and len(value.get_secret_value().strip()) < MIN_KEY_CHARS:
            raise ValueError(
                f"the token must be at least {MIN_KEY_CHARS} characters (it is "
                f"{len(value.get_secret_value().strip())}); a short one is guessed"
            )
        return value

    @field_validator("restricted_api")
    @classmethod
    def _long_keys(cls, value: SecretStr | None) -> SecretStr | None:
        if value is None:
            return value
        from service.auth import parse  # the keys are read here: a bad source stops start-up

        for group in parse(value.get_secret_value()):
            lengths = [len(key.decode("utf-8", "replace").strip()) for key in group.keys]
            short = [length for length in lengths if length < MIN_KEY_CHARS]
            if short:
                raise ValueError(
                    f"a key of {', '.join(sorted(group.classes))} has {min(short)} characters; "
                    f"each must have at least {MIN_KEY_CHARS} (a short one is guessed)"
                )
        return value

    @field_validator("providers", mode="before")
    @classmethod
    def _split_providers(cls, value: object) -> object:
        if isinstance(value, str):
            return [part.strip().lower() for part in value.split(",") if part.strip()]
        return value

    @field_validator("providers")
    @classmethod
    def _known_providers(cls, value: list[str]) -> list[str]:
        unknown = [p for p in value if p not in PROVIDER_NAMES]
        if unknown or not value:
            raise ValueError(
                f"unknown execution provider(s) {unknown or value}; "
                f"choose from: {', '.join(PROVIDER_NAMES)}"
            )
        return value

    @classmethod
    def variable(cls, field: str) -> str:
        """The environment variable that sets ``field``."""
        alias = cls.model_fields[field].validation_alias
        return alias if isinstance(alias, str) else ENV_PREFIX + field.upper()

    @property
    def ort_providers(self) -> list[str]:
        """The onnxruntime provider names, in order of preference."""
        return [PROVIDER_NAMES[p] for p in self.providers]

    @property
    def cuda_options(self) -> dict[str, str]:
        """The CUDA provider's options, as onnxruntime names and spells them."""
        options = {
            "device_id": str(self.cuda_device_id),
            "use_tf32": str(int(self.cuda_tf32)),
            "arena_extend_strategy": self.cuda_arena_extend_strategy,
            "cudnn_conv_algo_search": self.cuda_cudnn_conv_algo_search,
            "do_copy_in_default_stream": str(int(self.cuda_do_copy_in_default_stream)),
        }
        if self.cuda_gpu_mem_limit:
            options["gpu_mem_limit"] = str(self.cuda_gpu_mem_limit)
        return options

    @property
    def provider_options(self) -> list[dict[str, str]]:
        """Each of ``ort_providers``' options: the CUDA provider's from the settings."""
        cuda = PROVIDER_NAMES["cuda"]
        return [self.cuda_options if p == cuda else {} for p in self.ort_providers]


def _shown(value: object) -> str:
    """A default as its environment variable would spell it."""
    if value is None:
        return "unset"
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, list):
        return ",".join(map(str, value)) or "unset"
    return str(value)


# docs/settings.md's generated block (``contract.readme``), written by ``make settings-doc``.
REFERENCE_BLOCK = ("<!-- settings: generated by make settings-doc -->\n", "<!-- /settings -->\n")


def reference() -> str:
    """docs/settings.md's block: every setting's variable, default and description, from
    ``Settings`` itself (``tests/service/test_settings.py`` holds the page to it)."""
    rows = [REFERENCE_BLOCK[0].rstrip(), "| variable | default | meaning |", "|---|---|---|"]
    for name, field in Settings.model_fields.items():
        meaning = (field.description or "").replace("|", "\\|").replace("<", "&lt;")
        rows.append(f"| `{Settings.variable(name)}` | `{_shown(field.default)}` | {meaning} |")
    return "\n".join(rows) + "\n" + REFERENCE_BLOCK[1]


# The settings that hold credentials (their values never appear in a message).
SECRETS = frozenset(
    name for name, field in Settings.model_fields.items() if SecretStr in get_args(field.annotation)
)


def load_settings(**overrides: object) -> Settings:
    """Settings from the environment; ``SettingsError`` names each variable at fault."""
    try:
        return Settings(**overrides)  # type: ignore[arg-type]
    except ValidationError as exc:
        problems = []
        for error in exc.errors():
            field = str(error["loc"][0]) if error["loc"] else ""
            name = Settings.variable(field) if field in Settings.model_fields else field
            message = error["msg"].removeprefix("Value error, ")
            if field in SECRETS:  # a credential is never shown, not even a wrong one
                problems.append(f"{name}: {message}")
                continue
            value = os.environ.get(name, error.get("input"))
            # A check of several settings together names its variables in its message.
            problems.append(f"{name}={value}: {message}" if field else message)
        raise SettingsError("; ".join(problems)) from None
