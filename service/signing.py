"""Model versions verified before they load: OpenSSF model signing (``model-signing``).

A version directory may carry ``model.sig``, a signature over that directory (every file but
the signature itself) in OpenSSF model signing's format, as
``model_signing sign key <model>/<version> --private_key KEY --signature
<model>/<version>/model.sig`` or ``gelu-serve export --sign-key KEY`` writes it
(``contract.signing``). With
``GELU_MODEL_VERIFY_KEY`` (a PEM public key) every version must carry one that verifies under
that key, or it is not loaded: at start-up, on a load and when polling. A version's result is
kept while none of its files changes (size and modification time), so polling hashes nothing
that has not changed.
"""

from __future__ import annotations

import logging
import re
from pathlib import Path

from contract.signing import SIGNATURE_FILENAME
from service.errors import ModelLoadError, StartupError

logger = logging.getLogger("gelu_serve")

Stamps = tuple[tuple[str, int, int], ...]


def _stamps(version_dir: Path) -> Stamps:
    """Every file of the version: relative path, size, modification time."""
    stamps = []
    for path in sorted(version_dir.rglob("*")):
        if path.is_file():
            stat = path.stat()
            stamps.append((str(path.relative_to(version_dir)), stat.st_size, stat.st_mtime_ns))
    return tuple(stamps)


class Verifier:
    """Checks versions against one public key; remembers each version's last result."""

    def __init__(self, public_key: Path) -> None:
        try:
            from model_signing import verifying
        except ImportError:
            raise StartupError(
                "GELU_MODEL_VERIFY_KEY is set but model-signing is not installed: install the "
                "project's [signing] extra"
            ) from None
        self._config = verifying.Config().use_elliptic_key_verifier(public_key=public_key)
        self.public_key = public_key
        self._results: dict[Path, tuple[Stamps, str | None]] = {}  # by version directory

    def check(self, version_dir: Path, label: str) -> None:
        """Pass, or ``ModelLoadError`` saying why ``version_dir`` may not load."""
        if not (version_dir / SIGNATURE_FILENAME).is_file():
            raise ModelLoadError(
                f"{label}: unsigned (no {SIGNATURE_FILENAME}), and GELU_MODEL_VERIFY_KEY "
                "requires a signature"
            )
        stamps = _stamps(version_dir)
        known = self._results.get(version_dir)
        if known is not None and known[0] == stamps:
            reason = known[1]
        else:
            reason = self._verify(version_dir)
            self._results[version_dir] = (stamps, reason)
        if reason is not None:
            raise ModelLoadError(f"{label}: its signature does not verify: {reason}")

    def _verify(self, version_dir: Path) -> str | None:
        try:
            self._config.verify(version_dir, version_dir / SIGNATURE_FILENAME)
        except Exception as exc:  # model-signing raises ValueError and its verifiers' own
            text = str(exc).strip() or type(exc).__name__
            changed = re.findall(r"Hash mismatch for '([^']+)'", text)
            if changed:  # its message quotes both digests' bytes: name the files instead
                return f"{', '.join(changed)} changed since it was signed"
            return text.splitlines()[0][:300]
        logger.info("%s: signature verified with %s", version_dir, self.public_key)
        return None
