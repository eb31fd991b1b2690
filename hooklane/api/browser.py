"""The pages the dashboard and the portal share, one handler each whatever
the face: the endpoints, a delivery, and the resend button. Each face (the
admin's dashboard, :mod:`.dashboard`; one tenant's portal, :mod:`.portal`)
is a :class:`Face`: where its pages live, how it renders them and keeps
its one-shot message, and what it answers for a missing endpoint. What a
page reads and repairs is the request's scope's (:mod:`.actions`): in the
portal another tenant's endpoint renders exactly as one that does not
exist.
"""

from __future__ import annotations

import functools
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any

import asyncpg
from aiohttp import web

from hooklane import signing, store
from hooklane.api import actions, inputs, pages
from hooklane.api.auth import Audience, Handler, audience, connection, expect_continue
from hooklane.api.context import SETTINGS, repair_stop, scope
from hooklane.api.errors import Problem, answers_in
from hooklane.errors import InvalidInput
from hooklane.store.grants import Access

# A page of the most delayed endpoints: a few tens of kB however many
# endpoints there are; the rest are a click ("next") or a search away.
ENDPOINTS_PER_PAGE = 50


@dataclass(frozen=True)
class Face:
    """One face's own ways with its pages: where they live, how it renders
    them (``render(request, template, status=, **values)``) and its
    problems (``problem_page``; ``problem(request, status, title,
    detail)``), the headers of every answer, how it sets its one-shot
    message (``set_flash``; None drops it) and reads it
    (``flash_message``), and the page a button was on (``back``)."""

    home: str
    flash_cookie: str
    render: Callable[..., web.Response]
    problem_page: Callable[[web.Request, Problem], web.Response]
    problem: Callable[[web.Request, int, str, str], web.Response]
    headers: Callable[[web.Request], Mapping[str, str]]
    set_flash: Callable[[web.Request, web.Response, str | None], None]
    flash_message: Callable[[str | None], str | None]
    back: Callable[[web.Request, str, str], str]

    def endpoint_path(self, namespace: str, name: str) -> str:
        # Names are DNS labels and subdomains: nothing in them needs quoting.
        return f"{self.home}/endpoints/{namespace}/{name}"

    def redirect(self, request: web.Request, location: str, flash: str | None = None) -> web.Response:
        response = web.Response(status=303, headers={**self.headers(request), "Location": location})
        if flash is not None:
            self.set_flash(request, response, flash)
        return response

    def shown_once(self, request: web.Request, template: str, **values: Any) -> web.Response:
        """A page with the message the previous POST left, which the browser
        then drops: a reload does not show it again."""
        response = self.render(
            request, template, flash=self.flash_message(request.cookies.get(self.flash_cookie)), **values
        )
        if self.flash_cookie in request.cookies:
            self.set_flash(request, response, None)
        return response

    def no_endpoint(self, request: web.Request, namespace: str, name: str) -> web.Response:
        return self.problem(request, 404, "No such endpoint", pages.no_endpoint_text(namespace, name))

    def no_delivery(self, request: web.Request, namespace: str, name: str, delivery: str) -> web.Response:
        return self.problem(
            request, 404, "No such delivery", pages.no_delivery_text(namespace, name, delivery)
        )


Page = Callable[[web.Request, Face], Awaitable[web.Response]]


def add_routes(app: web.Application, face: Face, who: Audience) -> None:
    """Add the shared pages under ``face.home`` for ``who``."""
    router = app.router
    router.add_get(face.home, _route(who, face, endpoints_page))
    router.add_get(
        face.home + "/endpoints/{namespace}/{name}/deliveries/{id}", _route(who, face, delivery_page)
    )
    router.add_get(
        face.home + "/endpoints/{namespace}/{name}/deliveries/{id}/payload", _route(who, face, payload)
    )
    router.add_post(
        face.home + "/endpoints/{namespace}/{name}/resend",
        _route(who, face, resend, Access.RESEND),
        expect_handler=expect_continue,
    )


def _route(who: Audience, face: Face, page: Page, access: Access = Access.READ) -> Handler:
    @functools.wraps(page)
    async def routed(request: web.Request) -> web.Response:
        return await page(request, face)

    return audience(who, access=access)(answers_in(face.problem_page)(routed))


async def endpoints_page(request: web.Request, face: Face) -> web.Response:
    tenant = scope(request).tenant
    query = request.query
    chosen = inputs.tenant_filter(query, tenant)
    after = inputs.endpoint_cursor(query, "after")
    async with connection(request) as conn:
        page = await store.endpoint_page(conn, chosen, cursor=after, limit=ENDPOINTS_PER_PAGE)
        totals = await store.endpoint_totals(conn, chosen)
    # A tenant's search is within its own endpoints: no tenant to choose.
    search = [(k, v) for k, v in pages.search_query(chosen) if tenant is None or k != "tenant"]
    return face.shown_once(
        request,
        "endpoints.html",
        grant=scope(request).grant,
        **pages.endpoint_list(face.home, chosen, search, page, totals, later=after is not None),
    )


async def delivery_page(request: web.Request, face: Face) -> web.Response:
    namespace, name = inputs.endpoint_key(request)
    try:
        delivery_id = inputs.delivery_id(request.match_info["id"])
    except InvalidInput:
        return face.no_delivery(request, namespace, name, request.match_info["id"])
    keyring = request.config_dict[SETTINGS].encryption_key

    async def read(conn: asyncpg.Connection) -> tuple[store.DeliveryDetail | None, store.SentRequest | None]:
        key = (namespace, name)
        detail = await store.delivery_detail(conn, delivery_id, key)
        return detail, None if detail is None else await store.delivery_payload(
            conn, delivery_id, key, keyring
        )

    async with connection(request) as conn:
        found = await actions.with_health(conn, scope(request), namespace, name, read)
    if found is None:
        return face.no_endpoint(request, namespace, name)
    health, (detail, sent) = found
    if detail is None:
        return face.no_delivery(request, namespace, name, str(delivery_id))
    path = face.endpoint_path(namespace, name)
    return face.shown_once(
        request,
        "delivery.html",
        grant=scope(request).grant,
        health=health,
        detail=detail,
        delivery=detail.delivery,
        shown_at_most=store.MAX_ATTEMPTS_SHOWN,
        path=path,
        # Gone between the two reads (discarded and purged): no payload.
        payload=None if sent is None else pages.shown_payload(sent.body),
        request_headers=None if sent is None else pages.sent_headers(sent),
        terms_unreadable=sent is not None and sent.extra_headers is None,
        download=f"{path}/deliveries/{delivery_id}/payload",
        # Where its buttons come back to: this page.
        back=f"?delivery={delivery_id}",
    )


async def payload(request: web.Request, face: Face) -> web.Response:
    """The whole body a delivery sends, byte for byte, as a file to save:
    what its page shows the start of."""
    namespace, name = inputs.endpoint_key(request)
    try:
        delivery_id = inputs.delivery_id(request.match_info["id"])
    except InvalidInput:
        return face.no_delivery(request, namespace, name, request.match_info["id"])
    keyring = request.config_dict[SETTINGS].encryption_key
    async with connection(request) as conn:
        found = await actions.scoped(
            conn,
            scope(request),
            namespace,
            name,
            lambda c: store.delivery_payload(c, delivery_id, (namespace, name), keyring),
        )
    if found is None:
        # An endpoint out of scope answers as a delivery that is not there:
        # the store's None says the same of both.
        return face.no_delivery(request, namespace, name, str(delivery_id))
    return web.Response(
        body=found.body,
        content_type=signing.CONTENT_TYPE,
        headers={
            **face.headers(request),
            "Content-Disposition": f'attachment; filename="delivery-{delivery_id}.json"',
        },
    )


async def resend(request: web.Request, face: Face) -> web.Response:
    """Resend one dead delivery (``id``) or all of them."""
    namespace, name = inputs.endpoint_key(request)
    one = (await request.post()).get("id")
    ids = None if one is None else [inputs.delivery_id(str(one))]
    async with connection(request) as conn:
        done = await actions.resend(conn, scope(request), namespace, name, ids, repair_stop(request))
    if done is None:
        return face.no_endpoint(request, namespace, name)
    return face.redirect(request, face.back(request, namespace, name), pages.resend_flash(ids, done))
