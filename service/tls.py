"""TLS and mutual TLS on both faces, from files that may be replaced while the service runs.

``GELU_TLS_CERT_FILE`` and ``GELU_TLS_KEY_FILE`` turn TLS on for HTTP and gRPC alike;
``GELU_TLS_CLIENT_CA_FILE`` with ``GELU_TLS_CLIENT_AUTH=optional|required`` asks clients for a
certificate that CA signed. HTTP follows Mozilla's "intermediate" profile (TLS 1.2 and 1.3,
its TLS 1.2 ciphers; 1.3's suites are all allowed); gRPC's TLS (BoringSSL, in grpcio) allows
TLS 1.2 and up with forward-secret AEAD ciphers by default. Replaced files are read again: on
HTTP within a second, into a new context for the next handshakes (``TlsFiles.reload``), on gRPC
at the next handshake (grpcio asks ``TlsFiles.grpc_credentials``' fetcher); either way a
replaced client-CA file replaces the CAs trusted, never adds to them.
"""

from __future__ import annotations

import logging
import os
import ssl
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc

logger = logging.getLogger("gelu_serve")

# Mozilla's server-side TLS guidelines, "intermediate" (version 5.7): the TLS 1.2 suites.
INTERMEDIATE_CIPHERS = ":".join([
    "ECDHE-ECDSA-AES128-GCM-SHA256", "ECDHE-RSA-AES128-GCM-SHA256",
    "ECDHE-ECDSA-AES256-GCM-SHA384", "ECDHE-RSA-AES256-GCM-SHA384",
    "ECDHE-ECDSA-CHACHA20-POLY1305", "ECDHE-RSA-CHACHA20-POLY1305",
    "DHE-RSA-AES128-GCM-SHA256", "DHE-RSA-AES256-GCM-SHA384", "DHE-RSA-CHACHA20-POLY1305",
])  # fmt: skip
CLIENT_AUTH = {"none": ssl.CERT_NONE, "optional": ssl.CERT_OPTIONAL, "required": ssl.CERT_REQUIRED}


@dataclass
class TlsFiles:
    """The certificate, key and client CA files, and what they held when last read."""

    cert: Path
    key: Path
    client_ca: Path | None = None
    client_auth: str = "none"
    _read: tuple[tuple[int, int], ...] = field(default=(), repr=False)
    _current: ssl.SSLContext | None = field(default=None, repr=False)  # what handshakes use

    @classmethod
    def from_settings(cls, settings: Any) -> TlsFiles | None:
        """The settings' files, or None (TLS off)."""
        if settings.tls_cert_file is None:
            return None
        files = cls(settings.tls_cert_file, settings.tls_key_file,
                    settings.tls_client_ca_file, settings.tls_client_auth)  # fmt: skip
        files._read = files.stamp()
        return files

    def stamp(self) -> tuple[tuple[int, int], ...]:
        """Each file's modification time and size: a replaced file changes them."""
        paths = [self.cert, self.key, *([self.client_ca] if self.client_ca else [])]
        stamps = []
        for path in paths:
            try:
                stat = os.stat(path)
            except OSError:
                return self._read  # mid-replacement: keep what was read
            stamps.append((stat.st_mtime_ns, stat.st_size))
        return tuple(stamps)

    def changed(self) -> bool:
        """Whether the files changed since last read (and, if so, note them as read)."""
        now = self.stamp()
        if now == self._read:
            return False
        self._read = now
        return True

    # ---- HTTP (uvicorn) ----------------------------------------------------------------------

    def uvicorn_options(self) -> dict[str, Any]:
        """uvicorn's TLS options for these files."""
        options: dict[str, Any] = {
            "ssl_certfile": str(self.cert),
            "ssl_keyfile": str(self.key),
            "ssl_ciphers": INTERMEDIATE_CIPHERS,
            "ssl_cert_reqs": CLIENT_AUTH[self.client_auth],
        }
        if self.client_ca is not None:
            options["ssl_ca_certs"] = str(self.client_ca)
        return options

    @staticmethod
    def harden(context: ssl.SSLContext) -> None:
        """Mozilla intermediate's versions on a context: TLS 1.2 and up."""
        context.minimum_version = ssl.TLSVersion.TLSv1_2
        context.options |= ssl.OP_NO_COMPRESSION | ssl.OP_CIPHER_SERVER_PREFERENCE

    def context(self) -> ssl.SSLContext:
        """A new server context from the files as they are now, as uvicorn's options make it:
        its certificate, its client CAs (those alone), Mozilla intermediate."""
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        self.harden(context)
        context.set_ciphers(INTERMEDIATE_CIPHERS)
        context.load_cert_chain(self.cert, self.key)
        context.verify_mode = CLIENT_AUTH[self.client_auth]
        if self.client_ca is not None:
            context.load_verify_locations(self.client_ca)
            self._no_resumption(context)
        return context

    def serve_with(self, listening: ssl.SSLContext) -> None:
        """Serve with ``listening`` (uvicorn's context, which its servers keep) until the files
        change: each handshake then moves to the context ``reload`` made last (Python's
        ``sni_callback`` may set a handshake's context; OpenSSL calls it for every ClientHello,
        with a server name or without), so a replaced client-CA file replaces the trust store
        rather than adding to it."""
        self.harden(listening)
        if self.client_ca is not None:
            self._no_resumption(listening)
        self._current = listening
        listening.sni_callback = self._select

    def _select(self, handshake: Any, server_name: str | None, listening: ssl.SSLContext) -> None:
        current = self._current
        if current is not None and current is not listening:
            handshake.context = current
        return None

    @staticmethod
    def _no_resumption(context: ssl.SSLContext) -> None:
        """No session tickets where client certificates are checked: a TLS 1.3 ticket resumes
        a session without its certificate being checked again, which would outlive a replaced
        CA (the ticket keys stay with the listening context). TLS 1.2's session-ID cache, which
        Python cannot flush, still can, within OpenSSL's session lifetime."""
        context.num_tickets = 0
        context.options |= ssl.OP_NO_TICKET

    def reload(self) -> bool:
        """Read the files again if they changed: later handshakes use a new context made from
        them (``serve_with``). A pair that does not load (a key not yet matching its
        certificate) is logged and retried at the next change; the last context serves on."""
        if not self.changed():
            return False
        try:
            context = self.context()
        except (OSError, ssl.SSLError) as exc:
            self._read = ()  # try again at the next look
            logger.warning("TLS: %s, %s or the client CAs do not load (%s); serving the last "
                           "ones", self.cert, self.key, exc)  # fmt: skip
            return False
        self._current = context
        logger.info("TLS: certificate %s and client CAs read again", self.cert)
        return True

    # ---- gRPC ----------------------------------------------------------------------------------

    def _grpc_configuration(self) -> grpc.ServerCertificateConfiguration:
        pair = (self.key.read_bytes(), self.cert.read_bytes())
        roots = self.client_ca.read_bytes() if self.client_ca else None
        return grpc.ssl_server_certificate_configuration([pair], roots)

    def grpc_credentials(self) -> grpc.ServerCredentials:
        """grpcio's credentials for these files, read again at a handshake after they change."""
        watched = TlsFiles(self.cert, self.key, self.client_ca, self.client_auth, self.stamp())

        def fetch() -> grpc.ServerCertificateConfiguration | None:
            if not watched.changed():
                return None
            try:
                return watched._grpc_configuration()
            except OSError:
                watched._read = ()
                return None

        return grpc.dynamic_ssl_server_credentials(
            self._grpc_configuration(),
            fetch,
            require_client_authentication=self.client_auth == "required",
        )
