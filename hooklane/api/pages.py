"""What the two sets of server-rendered pages share: the admin's
dashboard (:mod:`.dashboard`) and the tenant portal (:mod:`.portal`).

How values are shown, the one-shot messages that a POST leaves for the
page it redirects to, the filters both read from a query string, the
strict headers, the Jinja environment (every value escaped) and the
static files. Each page set keeps its own routes, credentials, cookies and
reads; this module reads no database and knows no session.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from importlib import resources
from typing import Any
from urllib.parse import urlencode

import jinja2
from aiohttp import web
from markupsafe import Markup

from hooklane import charts, signing, store
from hooklane.api.auth import Audience, audience
from hooklane.endpoint_state import EndpointState, PauseReason
from hooklane.errors import shown
from hooklane.health import EndpointHealth
from hooklane.times import rfc3339

# How often a live page refreshes itself, and a page saying the database is
# away retries.
REFRESH_SECONDS = 5
LAST_ERROR_CHARS = 80


# How values are shown.


def age_text(seconds: float | None) -> str:
    """A duration as a person reads it at a glance: ``850 ms``, ``42 s``,
    ``4 min 3 s``, ``2 h 5 min``, ``3 d 4 h``; ``-`` for none."""
    if seconds is None:
        return "-"
    seconds = max(seconds, 0.0)
    if seconds < 1:
        return f"{seconds * 1000:.0f} ms"
    whole = int(seconds)
    for unit, size, sub, sub_size in (("d", 86400, "h", 3600), ("h", 3600, "min", 60), ("min", 60, "s", 1)):
        if whole >= size:
            rest = (whole % size) // sub_size
            return f"{whole // size} {unit}" + (f" {rest} {sub}" if rest else "")
    return f"{whole} s"


def relative_text(when: datetime | None, now: datetime) -> str:
    """``when`` seen from ``now``: ``in 12 s``, ``3 min ago``, ``now``."""
    if when is None:
        return "-"
    delta = (when - now).total_seconds()
    if abs(delta) < 1:
        return "now"
    return f"in {age_text(delta)}" if delta > 0 else f"{age_text(-delta)} ago"


@dataclass(frozen=True)
class NextAttempt:
    """When a pending delivery is tried next, as its endpoint stands: ``at``
    (None: not until someone acts on the endpoint), ``held``: what holds it
    past its own due time, and ``text``: ``at`` as a person reads it."""

    at: datetime | None
    held: str | None
    text: str


def next_attempt(due: datetime | None, h: EndpointHealth) -> NextAttempt | None:
    """The next attempt of a delivery due at ``due`` (None: not pending)
    of the endpoint ``h``. The endpoint outranks the delivery's own time,
    as the reservation has it (hooklane_deliverable, hooklane_reserve_v7): a
    delivery of a paused endpoint is not tried at its due time, however
    long ago that was, but when the pause ends."""
    if due is None:
        return None
    now = h.observed_at
    if h.standing.state == EndpointState.DEACTIVATED:
        return NextAttempt(None, "once the endpoint is reactivated", "")
    if h.standing.paused_by == PauseReason.MANUAL:
        return NextAttempt(None, "once the endpoint is resumed", "")
    if not h.signed:
        return NextAttempt(None, "once the endpoint has a signing secret", "")
    for until, held in (
        (h.paused_until, "after the circuit's pause"),
        (h.throttled_until, "after the receiver's hold (its Retry-After, or an overload)"),
    ):
        if until is not None and until > now and until > due:
            return NextAttempt(until, held, relative_text(until, now))
    if due <= now:
        # Waiting for a free slot or the rate limit: due, not done.
        return NextAttempt(
            due, None, "due now" if (now - due).total_seconds() < 1 else f"due {relative_text(due, now)}"
        )
    return NextAttempt(due, None, relative_text(due, now))


def short_text(text: str | None, limit: int = LAST_ERROR_CHARS) -> str:
    """``text`` cut to ``limit`` characters, with an ellipsis when cut."""
    if text is None:
        return ""
    return text if len(text) <= limit else text[: limit - 1] + "\u2026"


def refusal_text(field: str | None, detail: str) -> str:
    """A refusal as a sentence: the input at fault first when there is one."""
    return detail[:1].upper() + detail[1:] if field is None else f"{field} {detail}"


def no_endpoint_text(namespace: str, name: str) -> str:
    return f"There is no endpoint {namespace}/{name}."


def no_delivery_text(namespace: str, name: str, delivery: str) -> str:
    return f"Endpoint {namespace}/{name} has no delivery {shown(delivery)}."


# One-shot messages: a word (and a number) in a cookie, read once.


def flash_value(what: str, number: int | None = None) -> str:
    """The cookie value that tells the next page what happened."""
    return what if number is None else f"{what}.{number}"


def _resent(number: int) -> str:
    if number == 0:
        return "No dead deliveries to resend."
    return f"{number} dead {'delivery' if number == 1 else 'deliveries'} queued again."


# What the resends that both page sets make say they did.
_RESENDS: dict[str, str | Callable[[int], str]] = {
    "resent": _resent,
    "resent-partly": lambda number: (
        f"{number} dead {'delivery' if number == 1 else 'deliveries'} queued again; time ran out before"
        " the others: resend again to queue the rest."
    ),
    "resent-one": lambda number: f"Delivery {number} queued again.",
    "not-dead": lambda number: (
        f"Delivery {number} is not dead any more (resent or discarded already): nothing to resend."
    ),
}


class Flashes:
    """The one-shot messages of a page set: each word's sentence, or how it
    says the word's number; the resends' come with them."""

    def __init__(self, sentences: Mapping[str, str | Callable[[int], str]]) -> None:
        self._sentences = {**_RESENDS, **sentences}
        self._value = re.compile(f"({'|'.join(map(re.escape, self._sentences))})" + r"(?:\.(\d{1,19}))?")

    def message(self, value: str | None) -> str | None:
        """The sentence for a :func:`flash_value`; None for anything else,
        so that a cookie set elsewhere can only ever show one of these."""
        found = self._value.fullmatch(value or "")
        if found is None:
            return None
        said = self._sentences[found[1]]
        return said if isinstance(said, str) else said(int(found[2] or 0))


def resend_flash(ids: list[int] | None, done: store.Progress[int]) -> str:
    """What a resend of all the dead deliveries (``ids`` None) or of one
    says it did."""
    if ids is None:
        return flash_value("resent" if done.stopped_at is None else "resent-partly", done.count)
    return flash_value("resent-one" if done.count else "not-dead", ids[0])


# What a delivery sent.

# A delivery page shows this much of the payload; the rest is a download
# away: a page of a few tens of kB whatever the event's size.
PAYLOAD_SHOWN_BYTES = 64 * 1024
HIDDEN = "(hidden)"
# A JSON text's tokens, verbatim: a string (to the end of the text when it
# was cut inside one), a punctuation mark, or a literal or number.
_JSON_TOKEN = re.compile(r'"(?:[^"\\]|\\.)*(?:"|\\?$)|[{}\[\],:]|[^\s{}\[\],:"]+')


def pretty_json(text: str, indent: str = "  ") -> str:
    """``text`` indented, one member or item a line, every token as it was:
    no number or string is parsed and printed again (a ``numeric`` of 309
    digits stays one), and a text cut anywhere comes out as far as it goes."""
    out: list[str] = []
    depth = 0
    tokens = [m[0] for m in _JSON_TOKEN.finditer(text)]
    for i, token in enumerate(tokens):
        if token in ("{", "["):
            if i + 1 < len(tokens) and tokens[i + 1] in ("}", "]"):
                out.append(token)
                continue
            depth += 1
            out.append(token + "\n" + indent * depth)
        elif token in ("}", "]"):
            if out and out[-1] in ("{", "["):
                out.append(token)
                continue
            depth = max(depth - 1, 0)
            out.append("\n" + indent * depth + token)
        elif token == ",":
            out.append(",\n" + indent * depth)
        elif token == ":":
            out.append(": ")
        else:
            out.append(token)
    return "".join(out)


@dataclass(frozen=True)
class ShownPayload:
    """A delivery's body as its page shows it: ``text``, its first
    ``shown`` bytes pretty-printed, of ``size`` in all."""

    text: str
    shown: int
    size: int

    @property
    def cut(self) -> bool:
        return self.shown < self.size


def shown_payload(body: bytes, limit: int = PAYLOAD_SHOWN_BYTES) -> ShownPayload:
    # A cut may fall inside a character: its bytes are left out.
    head = body[:limit].decode("utf-8", errors="ignore")
    return ShownPayload(pretty_json(head), min(len(body), limit), len(body))


@dataclass(frozen=True)
class SentHeader:
    name: str
    value: str
    # Where the value comes from, when the page cannot show it as sent.
    note: str | None = None


def sent_headers(sent: store.SentRequest) -> list[SentHeader]:
    """The headers of a delivery's request as its page shows them, made by
    the worker's own :func:`hooklane.signing.request_headers`, without a
    secret: the signature (an HMAC of the body under the endpoint's
    signing secret: shown, it would let anyone who reads the page test
    guesses of the secret offline, and it is of no use to a person) and
    the values of the endpoint's own headers that were read from a Secret
    or name a credential (:func:`hooklane.store.delivery_payload`)."""
    extra = [(name, HIDDEN if value is None else value) for name, value in sent.extra_headers or ()]
    trace = sent.traceparent
    if trace is None and sent.last_trace_id is not None:
        trace = f"00-{sent.last_trace_id}-…"
    stamp = 0 if sent.last_started_at is None else int(sent.last_started_at.timestamp())
    made = signing.request_headers(extra, sent.event_id, stamp, HIDDEN, trace, sent.ordering)
    notes = {
        "webhook-timestamp": "each attempt's own: its start, in seconds since 1970"
        if sent.last_started_at is not None
        else "set by each attempt when it starts",
        "webhook-signature": "computed with the endpoint's signing secret",
        "traceparent": "the trace the event was published in (a worker that traces sends its own span in it)",
        "hooklane-ordering-sequence": "its number among its key's deliveries to this endpoint",
        **{name: "set for this endpoint" for name, _ in sent.extra_headers or ()},
    }
    if sent.last_started_at is None:
        made["webhook-timestamp"] = "-"
    return [
        SentHeader("Content-Type", signing.CONTENT_TYPE),
        SentHeader("User-Agent", signing.USER_AGENT),
        *(SentHeader(name, value, notes.get(name)) for name, value in made.items()),
    ]


# Reading the request.


def is_https(scheme: str, forwarded_proto: str | None) -> bool:
    """Whether the browser reached us over https: directly, or through an
    ingress that terminated TLS and says so in ``X-Forwarded-Proto``.
    Trusting that header can only make the cookie stricter (Secure), never
    looser, so a client that forges it harms only its own login."""
    if scheme == "https":
        return True
    return (forwarded_proto or "").split(",")[0].strip().lower() == "https"


def state_filter(text: str | None) -> str | None:
    """The deliveries page's ``state`` filter: one of the states, or all."""
    if not text:
        return None
    store.check_states([text])
    return text


def search_query(chosen: store.EndpointFilter) -> list[tuple[str, str]]:
    """The query string of a search, as the search form sends it (without
    what is left empty), for the links that page through its results."""
    values = [
        ("tenant", chosen.tenant),
        ("name_prefix", chosen.name_prefix),
        ("phase", None if chosen.phase is None else str(chosen.phase)),
        ("not_delivering", "true" if chosen.not_delivering else None),
    ]
    return [(key, value) for key, value in values if value]


def endpoint_list(
    home: str,
    chosen: store.EndpointFilter,
    search: list[tuple[str, str]],
    page: store.EndpointPage,
    totals: store.EndpointTotals,
    later: bool,
) -> dict[str, Any]:
    """What an endpoints page (``home``) shows of the ``page`` and
    ``totals`` its filter (``chosen``, sent as ``search``) read: ``later``,
    a page past the first."""
    return {
        "endpoints": page.endpoints,
        "totals": totals,
        "chosen": chosen,
        "phases": list(EndpointState),
        "searched": bool(search),
        "later": later,
        "first_url": f"{home}?{urlencode(search)}" if search else home,
        "next_url": None if page.cursor is None else f"{home}?{urlencode([*search, ('after', page.cursor)])}",
    }


@dataclass(frozen=True)
class SpanLink:
    """A link of an endpoint page's span switch: the same page, its charts
    over ``words`` (``current``: the span shown)."""

    words: str
    url: str
    current: bool


def span_links(path: str, kept: Sequence[tuple[str, str]], shown: charts.Span) -> list[SpanLink]:
    """The span switch of the endpoint page at ``path`` whose query string
    keeps ``kept`` (its filter): a link, not a script."""
    return [
        SpanLink(charts.SPANS[span].name, f"{path}?{urlencode([*kept, ('span', str(span))])}", span is shown)
        for span in charts.Span
    ]


def chart_svg(chart: charts.Chart) -> Markup:
    """A chart's drawing, as markup: :mod:`hooklane.charts` escapes every
    text it puts in it."""
    return Markup(chart.svg)


# Rendering.


def security_headers(frame_ancestors: Sequence[str] = ()) -> dict[str, str]:
    """Scripts and styles from this server only, never inline: should a
    value ever slip through unescaped, the browser still refuses to run it.
    No framing (``X-Frame-Options: DENY`` too, for older browsers) unless
    ``frame_ancestors`` lists the origins that may, so that no other site
    can lay the buttons under its own."""
    framed_by = " ".join(frame_ancestors) or "'none'"
    headers = {
        "Content-Security-Policy": (
            "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; "
            f"connect-src 'self'; form-action 'self'; frame-ancestors {framed_by}; base-uri 'none'"
        ),
        "X-Content-Type-Options": "nosniff",
        "Referrer-Policy": "same-origin",
        # The pages show deliveries, errors and, once, a signing secret: no
        # shared cache keeps them.
        "Cache-Control": "no-store",
    }
    if not frame_ancestors:
        headers["X-Frame-Options"] = "DENY"
    return headers


def environment(home: str, **globals: Any) -> jinja2.Environment:
    """The templates (``hooklane/api/templates``) of the pages under
    ``home``, every value escaped, with the filters and names that
    macros.html uses, and ``globals``."""
    templates = jinja2.Environment(
        loader=jinja2.PackageLoader("hooklane.api", "templates"),
        autoescape=True,
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
    )
    templates.filters.update(age=age_text, short=short_text, rfc3339=rfc3339, svg=chart_svg)
    templates.globals.update(
        relative=relative_text,
        next_attempt=next_attempt,
        home=home,
        states=store.STATES,
        chart_outcomes=charts.OUTCOMES,
        chart_lines=charts.LINES,
        bucket_text=charts.bucket_text,
        duration_text=charts.duration_text,
        **globals,
    )
    return templates


def render(
    templates: jinja2.Environment, template: str, status: int, headers: dict[str, str], **values: Any
) -> web.Response:
    """``template`` of ``templates`` as an HTML answer."""
    body = templates.get_template(template).render(**values)
    return web.Response(text=body, status=status, content_type="text/html", headers=headers)


_STATIC_TYPES = {".css": "text/css", ".js": "text/javascript"}
_STATIC = {
    item.name: (item.read_bytes(), _STATIC_TYPES[suffix])
    for item in resources.files("hooklane.api").joinpath("static").iterdir()
    if (suffix := "." + item.name.rpartition(".")[2]) in _STATIC_TYPES
}


@audience(Audience.OPEN)
async def static(request: web.Request) -> web.Response:
    """The stylesheets and scripts of ``hooklane/api/static``."""
    found = _STATIC.get(request.match_info["file"])
    if found is None:
        raise web.HTTPNotFound()
    body, content_type = found
    return web.Response(
        body=body,
        content_type=content_type,
        headers={"X-Content-Type-Options": "nosniff", "Cache-Control": "no-cache"},
    )
