"""Model versions verified before they load: OpenSSF model signing (``model-signing``).

A version directory may carry ``model.sig``, a signature over the version's view of its model
directory: ``config.pbtxt``, ``warmup/`` and the version's own files (``contract.signing``
names them; ``gelu-serve export --sign-key`` writes it). With ``GELU_MODEL_VERIFY_KEY`` (a PEM
public key) every version must carry one that verifies under that key, or it is not loaded: at
start-up, on a load and when polling.

What is verified is what loads (issue 62, item 4): the repository reads each file once into
memory (``service.repository.layout``), this module verifies the signature over exactly those
bytes, and those bytes, never the path again, go to onnxruntime and the warm-up. model-signing's
public API verifies files on disk, so the bytes are written to a private scratch directory and
verified there; nothing is remembered between loads (a verdict kept by size and modification
time served weights replaced after it was given).
"""

from __future__ import annotations

import logging
import re
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING

from contract.signing import SIGNATURE_FILENAME, materialize
from service.errors import ModelLoadError, StartupError, first_line

if TYPE_CHECKING:
    from model_signing import verifying

logger = logging.getLogger("gelu_serve")

# model-signing's mismatch report is the repr of a list of lines quoting each file (its quotes
# escaped where a digest's bytes hold one); the digests' bytes are of no use in a log.
_Q = r"\\?'"  # a quote, escaped or not
_MISMATCHES = (
    (re.compile(rf"Hash mismatch for {_Q}([^'\\]+){_Q}"), "{} changed since it was signed"),
    (re.compile(rf"Extra files found in model {_Q}[^']*{_Q}: ([^'\"\\\]]+)"), "{} not signed"),
    (re.compile(rf"Missing files in model {_Q}[^']*{_Q}: ([^'\"\\\]]+)"), "{} signed but absent"),
)


class Verifier:
    """Checks versions' files, as read into memory, against one public key."""

    def __init__(self, public_key: Path) -> None:
        try:
            from model_signing import verifying
        except ImportError:
            raise StartupError(
                "GELU_MODEL_VERIFY_KEY is set but model-signing is not installed: install the "
                "project's [signing] extra"
            ) from None
        self._verifying = verifying
        self.public_key = public_key
        self._config()  # an unreadable key fails at start-up, not at each load

    def _config(self) -> verifying.Config:
        # A fresh one per check: a Config keeps the hashing settings (ignored paths included)
        # of the first signature it verified.
        return self._verifying.Config().use_elliptic_key_verifier(public_key=self.public_key)

    def check(self, files: Mapping[str, bytes], signature: bytes | None, label: str) -> None:
        """Pass, or ``ModelLoadError`` saying why the version whose view is ``files`` (bytes by
        name relative to the model directory, ``contract.signing``) and whose ``model.sig``
        holds ``signature`` may not load."""
        if signature is None:
            raise ModelLoadError(
                f"{label}: unsigned (no {SIGNATURE_FILENAME}), and GELU_MODEL_VERIFY_KEY "
                "requires a signature"
            )
        reason = self._verify(files, signature)
        if reason is not None:
            raise ModelLoadError(f"{label}: its signature does not verify: {reason}")
        logger.info("%s: signature verified with %s", label, self.public_key)

    def _verify(self, files: Mapping[str, bytes], signature: bytes) -> str | None:
        with tempfile.TemporaryDirectory(prefix="gelu-verify-") as scratch:
            view, signed = Path(scratch) / "model", Path(scratch) / SIGNATURE_FILENAME
            materialize(files, view)
            signed.write_bytes(signature)
            try:
                self._config().verify(view, signed)
            except Exception as exc:  # model-signing raises ValueError and its verifiers' own
                return _reason(exc)
        return None


def _reason(exc: Exception) -> str:
    """model-signing's refusal in one line, naming files rather than quoting digests."""
    text = str(exc).strip() or type(exc).__name__
    found = [
        template.format(", ".join(m.strip(" ,") for m in pattern.findall(text)))
        for pattern, template in _MISMATCHES
        if pattern.search(text)
    ]
    return "; ".join(found) if found else first_line(exc)[:300]
