"""The model repository on disk, as Triton lays it out: ``<root>/<model>/config.pbtxt`` and
``<root>/<model>/<version>/model.onnx``; which models and versions there are, their configs,
what changes when their files change, and a version loaded on a runtime."""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path

from contract.metadata import ModelMetadata
from contract.model_config import (
    ConfigParseError,
    ModelConfig,
    derive_model_config,
    load_model_config,
)
from contract.names import CONFIG_FILENAME, ENSEMBLE_PLATFORM, MODEL_FILENAME, PLATFORM
from contract.signing import SIGNATURE_FILENAME
from service.ensemble import EnsembleSession, check_steps
from service.errors import ModelLoadError
from service.runtime import Model, Placement, Runtime, TensorSpec
from service.signing import Verifier

logger = logging.getLogger("gelu_serve")


def model_names(root: Path) -> list[str]:
    """The models a repository holds: its directories (export's ``.staging`` ones aside)."""
    return sorted(p.name for p in root.iterdir() if p.is_dir() and not p.name.startswith("."))


def read_config(
    model_dir: Path, complete: Callable[[Path], ModelConfig] | None = None
) -> ModelConfig:
    """A model's ``config.pbtxt``, checked against its directory; ``ModelLoadError`` if not.
    Without the file, ``complete`` (when given) derives one from the model itself."""
    config_path = model_dir / CONFIG_FILENAME
    try:
        if complete is not None and not config_path.exists():
            return complete(model_dir)
        config = load_model_config(config_path.read_text(), model_dir.name)
    except (OSError, ConfigParseError) as exc:
        raise ModelLoadError(f"{config_path}: {exc}") from None
    if config.name != model_dir.name:
        raise ModelLoadError(f"{config_path}: name {config.name!r} != directory name")
    if config.platform not in (PLATFORM, ENSEMBLE_PLATFORM):
        raise ModelLoadError(f"{config_path}: platform {config.platform!r} is not served")
    return config


_skipped: set[Path] = set()  # version directories already warned about


def version_dirs(model_dir: Path) -> dict[int, Path]:
    """A model's version directories by number. As Triton, a version is a positive integer;
    any other directory is skipped with a warning (once)."""
    versions: dict[int, Path] = {}
    for path in model_dir.iterdir():
        if not path.is_dir():
            continue
        if path.name.isascii() and path.name.isdigit() and int(path.name) > 0:
            versions[int(path.name)] = path
        elif path not in _skipped:
            _skipped.add(path)
            logger.warning("%s: not a version (a positive integer): skipped", path)
    return versions


def signature(model_dir: Path, version: int) -> tuple[int, ...]:
    """What changes when a version's files change: size and modification time of the model's
    ``config.pbtxt`` and its ``model.sig`` (those it has), then of its ``model.onnx``: (0, 0)
    where there is none (an ensemble's version has none; any other then fails to load)."""
    config = model_dir / CONFIG_FILENAME
    signed = model_dir / str(version) / SIGNATURE_FILENAME
    paths = [p for p in (config, signed) if p.exists()]
    stats = [(st.st_size, st.st_mtime_ns) for st in map(Path.stat, paths)]
    try:
        model = (model_dir / str(version) / MODEL_FILENAME).stat()
        stats.append((model.st_size, model.st_mtime_ns))
    except FileNotFoundError:
        stats.append((0, 0))
    return tuple(x for pair in stats for x in pair)


def config_completer(
    runtime: Runtime, default_max_batch_size: int
) -> Callable[[Path], ModelConfig]:
    """What derives a model's config from its highest version's ONNX file, as Triton's
    auto-complete does (see ``contract.model_config.derive_model_config``)."""

    def specs(tensors: list[TensorSpec]) -> list[tuple[str, str, tuple[int, ...]]]:
        return [(t.name, t.datatype, t.dims) for t in tensors]

    def complete(model_dir: Path) -> ModelConfig:
        versions = version_dirs(model_dir)
        if not versions:
            raise ModelLoadError(f"{model_dir}: no config.pbtxt, and no version to derive it from")
        path = versions[max(versions)] / MODEL_FILENAME
        session = runtime.open(path, f"{model_dir.name}/{max(versions)}")
        config = derive_model_config(
            model_dir.name, specs(session.inputs), specs(session.outputs), default_max_batch_size
        )
        session.close()
        logger.info("%s: no config.pbtxt; derived from %s", model_dir.name, path)
        return config

    return complete


def load_version(
    model_dir: Path,
    version: int,
    config: ModelConfig,
    runtime: Runtime,
    warmup_runs: int,
    verifier: Verifier | None = None,
) -> Model:
    """One version, its signature verified (with a ``verifier``), opened on ``runtime``,
    checked against ``config`` and warmed; ``ModelLoadError`` if not. Blocks: call it off
    the event loop."""
    label = f"{model_dir.name}/{version}"
    if config.platform == ENSEMBLE_PLATFORM:  # its steps run, each a model of its own
        check_steps(config, model_dir.parent, read_config)
        logger.info("loaded %s: an ensemble of %s", label, [s.model_name for s in config.steps])
        meta = ModelMetadata(name=config.name, version=str(version), arch=ENSEMBLE_PLATFORM)
        return Model(model_dir.name, str(version), config, EnsembleSession(config), meta)
    if verifier is not None:
        verifier.check(model_dir / str(version), label)
    placement = Placement(config.instance_count, config.cuda_graphs)
    session = runtime.open(model_dir / str(version) / MODEL_FILENAME, label, placement)
    try:
        meta = ModelMetadata.from_props(session.metadata_props)
    except ValueError as exc:
        session.close()
        raise ModelLoadError(f"{label}: unreadable metadata_props: {exc}") from None
    model = Model(model_dir.name, str(version), config, session, meta)
    try:
        model.check_against_config()
        model.warm_up(warmup_runs)
        for sample in model.run_warmups(model_dir / "warmup"):
            logger.info("%s: model_warmup %s ran", label, sample)
    except ModelLoadError:
        model.close()
        raise
    logger.info("loaded %s on %s", label, ", ".join(session.providers))
    return model
