"""The model repository on disk, as Triton lays it out: ``<root>/<model>/config.pbtxt`` and
``<root>/<model>/<version>/model.onnx``; which models and versions there are, their configs,
what changes when their files change, and a version loaded on a runtime.

A load reads each file once (issue 62, item 4): ``config.pbtxt``, the version's files and the
warm-up files, each a regular file reached below the model directory without a symbolic link,
each within a size bound, into memory; under ``GELU_MODEL_VERIFY_KEY`` the signature is
verified over those bytes (``service.signing``), and those bytes, never the path again, are
parsed, handed to the runtime and fed to the warm-up.
"""

from __future__ import annotations

import errno
import itertools
import logging
import os
import stat
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath

from contract.metadata import ModelMetadata
from contract.model_config import (
    MAX_CONFIG_BYTES,
    ConfigParseError,
    ModelConfig,
    derive_model_config,
    load_model_config,
)
from contract.names import CONFIG_FILENAME, ENSEMBLE_PLATFORM, MODEL_FILENAME, PLATFORM
from contract.signing import SIGNATURE_FILENAME, WARMUP_FOLDER, view_name
from service.ensemble import EnsembleSession, check_steps
from service.errors import ModelLoadError
from service.runtime import Model, Placement, Runtime, Session, TensorSpec
from service.signing import Verifier

logger = logging.getLogger("gelu_serve")

# What one file of a model may hold. An ONNX file is one protobuf message, which cannot pass
# 2 GiB (larger models need external data, which is not served: service.onnxrt); a
# config.pbtxt is bounded by its parser; a warm-up file is one sample.
MAX_MODEL_FILE_BYTES = 2**31
MAX_WARMUP_FILE_BYTES = 64 << 20
MAX_FILES = 1024  # in one version's view (config, warmup/, the version directory)
_DIRECTORY = os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC
# A FIFO would block open() without O_NONBLOCK; a regular file reads as usual with it.
_FILE = os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK


def model_names(root: Path, limit: int | None = None) -> list[str]:
    """The models a repository holds: its directories (export's ``.staging`` ones aside); with
    ``limit``, those among its first ``limit`` entries (in the directory's own order)."""
    entries = itertools.islice(root.iterdir(), limit)
    return sorted(p.name for p in entries if p.is_dir() and not p.name.startswith("."))


@contextmanager
def _directory(path: Path | str, parent: int | None = None, shown: str = "") -> Iterator[int]:
    """An open directory: ``path`` itself (the model directory, as the repository names it), or
    the entry ``path`` of the open directory ``parent``, never through a symbolic link;
    ``ModelLoadError`` (naming it ``shown``) if it cannot be opened."""
    flags = _DIRECTORY if parent is None else _DIRECTORY | os.O_NOFOLLOW
    try:
        fd = os.open(path, flags, dir_fd=parent)
    except OSError as exc:
        link = exc.errno == errno.ENOTDIR and parent is not None  # O_NOFOLLOW's word, maybe
        if link and stat.S_ISLNK(os.stat(path, dir_fd=parent, follow_symlinks=False).st_mode):
            exc.errno = errno.ELOOP
        raise ModelLoadError(f"{shown or path}: {_why(exc, 'directory')}") from None
    try:
        yield fd
    finally:
        os.close(fd)


def _why(exc: OSError, kind: str) -> str:
    if exc.errno == errno.ELOOP:
        return "a symbolic link; a model's files are read below its directory without one"
    if exc.errno == errno.ENOENT:
        return f"no such {kind}"
    if exc.errno == errno.ENOTDIR:
        return "not a directory"
    return exc.strerror or type(exc).__name__


def _read(parent: int, name: str, limit: int, shown: str) -> bytes:
    """The bytes of the regular file ``name`` of the open directory ``parent``, at most
    ``limit`` of them; ``ModelLoadError`` (naming it ``shown``) for a symbolic link, anything
    but a regular file, or a larger file."""
    try:
        fd = os.open(name, _FILE, dir_fd=parent)
    except OSError as exc:
        raise ModelLoadError(f"{shown}: {_why(exc, 'file')}") from None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise ModelLoadError(f"{shown}: not a regular file")
        chunks, size = [], 0
        while chunk := os.read(fd, min(1 << 24, limit + 1 - size)):
            chunks.append(chunk)
            size += len(chunk)
            if size > limit:
                raise ModelLoadError(f"{shown}: larger than {limit} bytes")
        return b"".join(chunks)
    finally:
        os.close(fd)


def _tree(parent: int, name: str, prefix: str, files: dict[str, bytes], limit: int) -> None:
    """Every file under the directory ``name`` of ``parent`` into ``files`` (by view name under
    ``prefix``): regular files and directories only, no symbolic link, at most ``MAX_FILES``."""
    with _directory(name, parent, prefix) as fd:
        for entry in sorted(os.scandir(fd), key=lambda e: e.name):
            shown = view_name(prefix, entry.name)
            if entry.is_dir(follow_symlinks=False):
                _tree(fd, entry.name, shown, files, limit)
                continue
            if len(files) >= MAX_FILES:
                raise ModelLoadError(f"{shown}: more than {MAX_FILES} files to verify")
            files[shown] = _read(fd, entry.name, limit, shown)


def warmup_file(name: str) -> str:
    """A ``model_warmup`` ``input_data_file`` as a name of the signed view (``warmup/...``);
    ``ModelLoadError`` unless it names a file under the model's ``warmup/`` folder: relative,
    without ``..`` or ``.``, as Triton requires (an absolute ``/dev/zero`` would be read
    whole)."""
    parts = PurePosixPath(name).parts
    if not parts or name.startswith("/") or "\0" in name or any(p in (".", "..") for p in parts):
        raise ModelLoadError(
            f"model_warmup input_data_file {name!r} must name a file under {WARMUP_FOLDER}/ "
            "(a relative path, without '.' or '..')"
        )
    return view_name(WARMUP_FOLDER, *parts)


@dataclass
class VersionFiles:
    """A version's files as read, once, into memory: bytes by their name relative to the model
    directory (``contract.signing``'s view), and its signature (``None`` when it has none)."""

    files: dict[str, bytes] = field(default_factory=dict)
    signature: bytes | None = None


def read_version(
    model_dir: Path, version: int, config: ModelConfig | None, whole: bool
) -> VersionFiles:
    """The version's files: with ``whole``, its whole signed view and its signature (for a
    verifier); otherwise its model file and the warm-up files ``config`` names. Each is read
    once, bounded, below ``model_dir`` without a symbolic link; ``ModelLoadError`` if not."""
    label, read = f"{model_dir.name}/{version}", VersionFiles()
    try:
        warmups = [warmup_file(i.file) for w in (config.warmups if config else ())
                   for i in w.inputs if i.source == "file"]  # fmt: skip
        with _directory(model_dir, shown=model_dir.name) as model:
            if whole:
                names = set(os.listdir(model))
                if CONFIG_FILENAME in names:
                    read.files[CONFIG_FILENAME] = _read(
                        model, CONFIG_FILENAME, MAX_CONFIG_BYTES, CONFIG_FILENAME
                    )
                if WARMUP_FOLDER in names:
                    _tree(model, WARMUP_FOLDER, WARMUP_FOLDER, read.files, MAX_WARMUP_FILE_BYTES)
                _tree(model, str(version), str(version), read.files, MAX_MODEL_FILE_BYTES)
                read.signature = read.files.pop(view_name(str(version), SIGNATURE_FILENAME), None)
            else:
                with _directory(str(version), model, str(version)) as version_fd:
                    name = view_name(str(version), MODEL_FILENAME)
                    read.files[name] = _read(version_fd, MODEL_FILENAME, MAX_MODEL_FILE_BYTES, name)
                for name in warmups:
                    read.files[name] = _read_below(model, name, MAX_WARMUP_FILE_BYTES)
    except OSError as exc:  # listing a directory that went away meanwhile
        raise ModelLoadError(f"{label}: {_why(exc, 'file')}") from None
    except ModelLoadError as exc:
        raise ModelLoadError(f"{label}: {exc}") from None
    for name in warmups:
        if name not in read.files:
            raise ModelLoadError(f"{label}: {name}: no such file")
    if view_name(str(version), MODEL_FILENAME) not in read.files:
        raise ModelLoadError(f"{label}: no {MODEL_FILENAME}")
    return read


def _read_below(parent: int, name: str, limit: int) -> bytes:
    """The file ``name`` (a view name) below the open directory ``parent``, each directory on
    the way opened without following a symbolic link."""

    def below(parent: int, parts: tuple[str, ...]) -> bytes:
        if len(parts) == 1:
            return _read(parent, parts[0], limit, name)
        shown = view_name(*PurePosixPath(name).parts[: -len(parts) + 1])
        with _directory(parts[0], parent, shown) as fd:
            return below(fd, parts[1:])

    return below(parent, PurePosixPath(name).parts)


def parse_config(raw: bytes, model_dir: Path) -> ModelConfig:
    """``config.pbtxt``'s bytes as the model's config, checked against its directory;
    ``ModelLoadError`` if not."""
    config_path = model_dir / CONFIG_FILENAME
    try:
        config = load_model_config(raw, model_dir.name, source=str(config_path))
    except ConfigParseError as exc:  # it names the file and the line
        raise ModelLoadError(str(exc)) from None
    if config.name != model_dir.name:
        raise ModelLoadError(f"{config_path}: name {config.name!r} != directory name")
    if config.platform not in (PLATFORM, ENSEMBLE_PLATFORM):
        raise ModelLoadError(f"{config_path}: platform {config.platform!r} is not served")
    return config


def read_config(
    model_dir: Path, complete: Callable[[Path], ModelConfig] | None = None
) -> ModelConfig:
    """A model's ``config.pbtxt``, checked against its directory; ``ModelLoadError`` if not.
    Without the file, ``complete`` (when given) derives one from the model itself."""
    config_path = model_dir / CONFIG_FILENAME
    if complete is not None and not os.path.lexists(config_path):
        return complete(model_dir)
    with _directory(model_dir, shown=str(model_dir)) as model:
        raw = _read(model, CONFIG_FILENAME, MAX_CONFIG_BYTES, str(config_path))
    return parse_config(raw, model_dir)


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


def _specs(tensors: list[TensorSpec]) -> list[tuple[str, str, tuple[int, ...]]]:
    return [(t.name, t.datatype, t.dims) for t in tensors]


def _checked(
    model_dir: Path,
    version: int,
    config: ModelConfig | None,
    verifier: Verifier | None,
) -> VersionFiles:
    """The version's files, read once; with a ``verifier``, its whole view verified."""
    read = read_version(model_dir, version, config, whole=verifier is not None)
    if verifier is not None:
        verifier.check(read.files, read.signature, f"{model_dir.name}/{version}")
    return read


def config_completer(
    runtime: Runtime, default_max_batch_size: int, verifier: Verifier | None = None
) -> Callable[[Path], ModelConfig]:
    """What derives a model's config from its highest version's ONNX file, as Triton's
    auto-complete does (see ``contract.model_config.derive_model_config``), from the tensors
    the file declares: no session is opened on it (issue 62, item 4), and with a ``verifier``
    its signature is verified first. A version then loads only under the config its own
    verified file derives (``load_version``)."""

    def complete(model_dir: Path) -> ModelConfig:
        versions = version_dirs(model_dir)
        if not versions:
            raise ModelLoadError(f"{model_dir}: no config.pbtxt, and no version to derive it from")
        version, label = max(versions), f"{model_dir.name}/{max(versions)}"
        read = _checked(model_dir, version, None, verifier)
        inputs, outputs = runtime.declared(
            read.files[view_name(str(version), MODEL_FILENAME)], label
        )
        try:
            config = derive_model_config(
                model_dir.name, _specs(inputs), _specs(outputs), default_max_batch_size
            )
        except ConfigParseError as exc:
            raise ModelLoadError(f"{label}: {exc}") from None
        logger.info("%s: no config.pbtxt; derived from %s", model_dir.name, label)
        return config

    return complete


def _same_config(
    read: VersionFiles, model_dir: Path, config: ModelConfig, session: Session, label: str
) -> None:
    """Under a verifier, ``config`` (read or derived before the load) must be the verified
    one: the parse of the verified ``config.pbtxt``, or without one the config derived from
    the verified model file. ``ModelLoadError`` if it is not (a file replaced meanwhile)."""
    raw = read.files.get(CONFIG_FILENAME)
    if raw is not None:
        verified = parse_config(raw, model_dir)
    else:
        inputs, outputs = _specs(session.inputs), _specs(session.outputs)
        try:
            verified = derive_model_config(config.name, inputs, outputs, config.max_batch_size)
        except ConfigParseError as exc:
            raise ModelLoadError(f"{label}: {exc}") from None
    if verified != config:
        raise ModelLoadError(
            f"{label}: {CONFIG_FILENAME} changed while it loaded (not the one verified)"
        )


def load_version(
    model_dir: Path,
    version: int,
    config: ModelConfig,
    runtime: Runtime,
    warmup_runs: int,
    verifier: Verifier | None = None,
) -> Model:
    """One version, its files read once (and with a ``verifier`` their signature verified
    over those bytes), opened on ``runtime`` from those bytes, checked against ``config`` and
    warmed with the warm-up files read with them; ``ModelLoadError`` if not. Blocks: call it
    off the event loop."""
    label = f"{model_dir.name}/{version}"
    if config.platform == ENSEMBLE_PLATFORM:  # its steps run, each a model of its own
        check_steps(config, model_dir.parent, read_config)
        logger.info("loaded %s: an ensemble of %s", label, [s.model_name for s in config.steps])
        meta = ModelMetadata(name=config.name, version=str(version), arch=ENSEMBLE_PLATFORM)
        return Model(model_dir.name, str(version), config, EnsembleSession(config), meta)
    read = _checked(model_dir, version, config, verifier)
    placement = Placement(config.instance_count, config.cuda_graphs)
    model_bytes = read.files.pop(view_name(str(version), MODEL_FILENAME))
    session = runtime.open(model_bytes, label, placement)
    del model_bytes  # the runtime holds what it needs
    try:
        if verifier is not None:
            _same_config(read, model_dir, config, session, label)
        try:
            meta = ModelMetadata.from_props(session.metadata_props)
        except ValueError as exc:
            raise ModelLoadError(f"{label}: unreadable metadata_props: {exc}") from None
    except ModelLoadError:
        session.close()
        raise
    model = Model(model_dir.name, str(version), config, session, meta)
    samples = {i.file: read.files[warmup_file(i.file)] for w in config.warmups for i in w.inputs
               if i.source == "file"}  # fmt: skip
    try:
        model.check_against_config()
        model.warm_up(warmup_runs)
        for sample in model.run_warmups(samples):
            logger.info("%s: model_warmup %s ran", label, sample)
    except ModelLoadError:
        model.close()
        raise
    logger.info("loaded %s on %s", label, ", ".join(session.providers))
    return model
