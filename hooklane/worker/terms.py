"""An endpoint's request terms as a worker sends with them: its extra
headers, and the TLS context of its private CA and client certificate,
opened from the sealed row once and kept while the row holds the same."""

from __future__ import annotations

import contextlib
import os
import ssl
from collections.abc import Iterator
from dataclasses import dataclass, field

from hooklane.delivery import RequestTerms
from hooklane.secrets import Keyring, unseal

# Endpoints whose opened terms a worker keeps; past it, it starts over.
_CACHED = 10_000


@dataclass(frozen=True)
class Terms:
    headers: dict[str, str] = field(default_factory=dict)
    # None: the system's trust store and no client certificate.
    ssl_context: ssl.SSLContext | None = None
    server_name: str | None = None


NONE = Terms()


class TermsCache:
    """Opened terms by endpoint and sealed value: a rotated Secret gives the
    row another value, so the cache never serves old terms."""

    def __init__(self, keyring: Keyring | None) -> None:
        self._keyring = keyring
        self._opened: dict[tuple[str, str], Terms] = {}

    def get(self, sealed: str | None, bound: str) -> Terms:
        """The terms of an endpoint's row (``bound``: its terms_owner).
        Raises ``InvalidInput`` or ``ssl.SSLError`` for a row that does not
        open or hold what Hooklane stores: the attempt fails with it."""
        if sealed is None:
            return NONE
        key = (bound, sealed)
        found = self._opened.get(key)
        if found is None:
            if len(self._opened) >= _CACHED:
                self._opened.clear()
            found = self._opened[key] = opened(RequestTerms.from_json(unseal(self._keyring, sealed, bound)))
        return found


def opened(terms: RequestTerms) -> Terms:
    context = None
    if terms.tls:
        context = (
            ssl.create_default_context(cadata=terms.ca_pem) if terms.ca_pem else ssl.create_default_context()
        )
        if terms.cert_pem and terms.key_pem:
            with _in_memory(terms.cert_pem) as cert, _in_memory(terms.key_pem) as key:
                context.load_cert_chain(cert, key)
    return Terms(dict(terms.headers), context, terms.server_name)


@contextlib.contextmanager
def _in_memory(text: str) -> Iterator[str]:
    """A path to ``text`` that is never on a disk: ``load_cert_chain`` reads
    files only, and a client's private key has no business in /tmp."""
    fd = os.memfd_create("hooklane-tls", os.MFD_CLOEXEC)
    try:
        os.write(fd, text.encode())
        yield f"/proc/self/fd/{fd}"
    finally:
        os.close(fd)
