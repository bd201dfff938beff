"""A version's signature, as the repository contract names it: ``<model>/<version>/model.sig``,
OpenSSF model signing's format (``model-signing``, the [signing] extra).

What it signs is the version's *view* of its model directory (issue 62, item 4): every file
that shapes what serves, named by its path relative to the model directory:

- ``config.pbtxt``, the model's config (when it has one);
- ``warmup/...``, every file of the model's warm-up folder (``model_warmup`` reads from it);
- ``<version>/...``, every file of the version directory but ``model.sig`` itself.

Those are exactly the files that ``model_signing sign key <model> --ignore-paths`` (every
other version and every other file of the model directory) signs. ``gelu-serve export
--sign-key`` writes it through ``sign``; the service reads each file once, verifies the
signature over those bytes and loads those bytes (``service.signing``), when
``GELU_MODEL_VERIFY_KEY`` is set.
"""

from __future__ import annotations

import tempfile
from collections.abc import Mapping
from pathlib import Path, PurePosixPath

from contract.names import CONFIG_FILENAME

SIGNATURE_FILENAME = "model.sig"
WARMUP_FOLDER = "warmup"  # <model>/warmup/: Triton's model_warmup input_data_file folder


def view_name(*parts: str) -> str:
    """A file's name in the signed view: its path relative to the model directory."""
    return str(PurePosixPath(*parts))


def materialize(files: Mapping[str, bytes], folder: Path) -> None:
    """Write a view's ``files`` (bytes by ``view_name``) under the new directory ``folder``:
    what model-signing hashes, on both sides. ``ValueError`` for a name that is not a plain
    relative path."""
    folder.mkdir(mode=0o700)
    for name, data in files.items():
        parts = PurePosixPath(name).parts
        if not parts or name.startswith("/") or any(p in ("", ".", "..") for p in parts):
            raise ValueError(f"{name!r} is not a relative path inside the model directory")
        path = folder.joinpath(*parts)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)


def _tree(folder: Path, prefix: str) -> dict[str, bytes]:
    """Every regular file under ``folder``, by view name under ``prefix``; a symbolic link or
    other special file is an error (model-signing does not sign them either)."""
    files: dict[str, bytes] = {}
    for path in sorted(folder.rglob("*")):
        if path.is_symlink() or not (path.is_file() or path.is_dir()):
            raise ValueError(f"{path}: not a regular file or directory; it cannot be signed")
        if path.is_file():
            files[view_name(prefix, *path.relative_to(folder).parts)] = path.read_bytes()
    return files


def version_view(version_dir: Path, config: bytes | None = None) -> dict[str, bytes]:
    """The files a signature of ``version_dir`` covers, read from disk (the signer's side):
    the model's ``config.pbtxt`` (``config`` in its place when given: export signs before the
    file is in place), its ``warmup/`` files and the version's files."""
    model_dir = version_dir.parent
    files: dict[str, bytes] = {}
    if config is None and (model_dir / CONFIG_FILENAME).is_file():
        config = (model_dir / CONFIG_FILENAME).read_bytes()
    if config is not None:
        files[CONFIG_FILENAME] = config
    if (model_dir / WARMUP_FOLDER).is_dir():
        files.update(_tree(model_dir / WARMUP_FOLDER, WARMUP_FOLDER))
    version = _tree(version_dir, version_dir.name)
    version.pop(view_name(version_dir.name, SIGNATURE_FILENAME), None)
    return files | version


def sign(version_dir: Path, private_key: Path, config: bytes | None = None) -> Path:
    """Sign ``version_dir``'s view (``version_view``) with a PEM elliptic-curve private key;
    the signature's path. ``config``: the model's ``config.pbtxt`` when it is not yet on disk."""
    from model_signing import signing

    signature = version_dir / SIGNATURE_FILENAME
    with tempfile.TemporaryDirectory(prefix="gelu-sign-") as scratch:
        view = Path(scratch) / version_dir.parent.name
        materialize(version_view(version_dir, config), view)
        signing.Config().use_elliptic_key_signer(private_key=private_key).sign(view, signature)
    return signature
