"""A version's signature, as the repository contract names it: ``<model>/<version>/model.sig``,
OpenSSF model signing's format (``model-signing``, the [signing] extra), made over the version
directory. ``gelu-serve export --sign-key`` writes it; the service verifies it
(``service.signing``) when ``GELU_MODEL_VERIFY_KEY`` is set."""

from __future__ import annotations

from pathlib import Path

SIGNATURE_FILENAME = "model.sig"


def sign(version_dir: Path, private_key: Path) -> Path:
    """Sign ``version_dir`` with a PEM elliptic-curve private key, as model_signing's command
    does (the signature file itself, and git's files, left out); the signature's path."""
    from model_signing import hashing, signing

    signature = version_dir / SIGNATURE_FILENAME
    hashed = hashing.Config().set_ignored_paths(paths=[signature], ignore_git_paths=True)
    config = signing.Config().set_hashing_config(hashed)
    config.use_elliptic_key_signer(private_key=private_key).sign(version_dir, signature)
    return signature
