"""An endpoint's request terms as a worker sends with them: its extra
headers, and the TLS context of its private CA and client certificate,
opened from the sealed row once and kept while the row holds the same."""

from __future__ import annotations

import ssl
from collections import OrderedDict
from dataclasses import dataclass, field

from hooklane.delivery import RequestTerms
from hooklane.errors import InvalidInput
from hooklane.secrets import Keyring, unseal
from hooklane.tls import TlsMaterialError, client_context

# Endpoints whose opened terms a worker keeps, the least recently sent to
# dropped first. A context with a client certificate is some tens of KiB
# (the system's trust is looked up, not loaded: hooklane/tls.py).
_CACHED = 20_000


@dataclass(frozen=True)
class Terms:
    headers: dict[str, str] = field(default_factory=dict, repr=False)
    # None: the system's trust store and no client certificate.
    ssl_context: ssl.SSLContext | None = None
    server_name: str | None = None


NONE = Terms()


class TermsCache:
    """Opened terms by endpoint, with the sealed value they were opened
    from: a rotated Secret, or the same terms sealed again, gives the row
    another value, so the cache never serves old terms and holds one entry
    an endpoint."""

    def __init__(self, keyring: Keyring | None) -> None:
        self._keyring = keyring
        self._opened: OrderedDict[str, tuple[str, Terms]] = OrderedDict()

    def __len__(self) -> int:
        return len(self._opened)

    def get(self, sealed: str | None, bound: str) -> Terms:
        """The terms of an endpoint's row (``bound``: its terms_owner).
        Raises ``InvalidInput`` for a row that does not open or hold what
        Hooklane stores: the attempt fails with it."""
        if sealed is None:
            return NONE
        found = self._opened.get(bound)
        if found is not None and found[0] == sealed:
            self._opened.move_to_end(bound)
            return found[1]
        terms = opened(RequestTerms.from_json(unseal(self._keyring, sealed, bound)))
        self._opened[bound] = (sealed, terms)
        self._opened.move_to_end(bound)
        if len(self._opened) > _CACHED:
            self._opened.popitem(last=False)
        return terms


def opened(terms: RequestTerms) -> Terms:
    try:
        context = client_context(terms.ca_pem, terms.cert_pem, terms.key_pem)
    except TlsMaterialError as exc:
        # Checked before the endpoint was stored (hooklane/delivery.py):
        # a row written by hand, or a trust store changed since.
        raise InvalidInput(f"spec.delivery.tls ({exc.part})", f"refused by OpenSSL: {exc.reason}") from None
    return Terms(dict(terms.headers), context, terms.server_name)
