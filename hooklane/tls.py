"""The TLS context of an endpoint's ``spec.delivery.tls``: its private CA
and client certificate, built the same way by the worker that sends with it
and by the operator and ``hooklane endpoint apply``, which build it once
before storing the endpoint so that what OpenSSL refuses (a key too small,
a cut-off bundle) is refused there with the field named, not at every
delivery."""

from __future__ import annotations

import contextlib
import functools
import os
import re
import ssl
from collections.abc import Iterator

# The certificates of a bundle, without the text around them (a bundle's
# comments may be in any language; OpenSSL takes ASCII only).
_PEM_CERTIFICATE = re.compile(r"-----BEGIN CERTIFICATE-----[^-]+-----END CERTIFICATE-----")
# OpenSSL's name for a certificate in a hashed directory (c_rehash).
_HASHED = re.compile(r"[0-9a-f]{8}\.[0-9]+")


class TlsMaterialError(Exception):
    """OpenSSL refused part of the material: ``part`` is ``"ca"`` or
    ``"client_certificate"``; ``reason`` is OpenSSL's, naming no secret."""

    def __init__(self, part: str, reason: str) -> None:
        super().__init__(f"{part}: {reason}")
        self.part = part
        self.reason = reason


def client_context(ca_pem: str | None, cert_pem: str | None, key_pem: str | None) -> ssl.SSLContext | None:
    """A client context that trusts ``ca_pem`` only (or the system's trust
    store) and presents ``cert_pem`` with ``key_pem``; None when neither is
    given (the HTTP client's own shared context does). Raises
    ``TlsMaterialError``."""
    if not ca_pem and not (cert_pem and key_pem):
        return None
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    if ca_pem:
        bundle = "\n".join(_PEM_CERTIFICATE.findall(ca_pem))
        try:
            context.load_verify_locations(cadata=bundle)
        except (ssl.SSLError, ValueError, TypeError) as exc:
            raise TlsMaterialError("ca", _reason(exc)) from None
    else:
        _system_trust(context)
    if cert_pem and key_pem:
        try:
            with in_memory(cert_pem) as cert, in_memory(key_pem) as key:
                context.load_cert_chain(cert, key)
        except (ssl.SSLError, ValueError, OSError) as exc:
            raise TlsMaterialError("client_certificate", _reason(exc)) from None
    return context


def _reason(exc: Exception) -> str:
    # An SSLError's reason is OpenSSL's code (EE_KEY_TOO_SMALL); its text
    # carries a source line of _ssl.c that says nothing to a user.
    return getattr(exc, "reason", None) or str(exc) or type(exc).__name__


def _system_trust(context: ssl.SSLContext) -> None:
    """The system's trust store, looked up in its hashed directory as each
    handshake needs a CA, where there is one: loading the whole bundle file
    costs each context some 20 ms and 800 KiB, once per endpoint with a
    client certificate."""
    directory = hashed_directory()
    if directory is None:
        context.load_default_certs()
    else:
        context.load_verify_locations(capath=directory)


@functools.cache
def hashed_directory() -> str | None:
    # SSL_CERT_FILE names a bundle to use instead: only the file says what
    # it trusts.
    if os.environ.get("SSL_CERT_FILE"):
        return None
    directory = ssl.get_default_verify_paths().capath
    try:
        if directory and any(_HASHED.fullmatch(name) for name in os.listdir(directory)):
            return directory
    except OSError:
        pass
    return None


@contextlib.contextmanager
def in_memory(text: str) -> Iterator[str]:
    """A path to ``text`` that is never on a disk: ``load_cert_chain`` reads
    files only, and a client's private key has no business in /tmp."""
    fd = os.memfd_create("hooklane-tls", os.MFD_CLOEXEC)
    try:
        os.write(fd, text.encode())
        yield f"/proc/self/fd/{fd}"
    finally:
        os.close(fd)
