"""The event catalogue's JSON routes (docs/catalogue.md, "Where the
catalogue shows"): a page of its types and one type, alike for the admin
API and the tenant API (the catalogue is the platform's, every tenant
reads all of it, archived types too, marked); and the catalogue as an
OpenAPI 3.1 document (:mod:`hooklane.catalogue_openapi`).

The export's route takes an admin token: the platform's operators fetch
it to publish or hand to their customers. A route of this API serves one
audience (tests/db/test_api_scopes.py), and tenants get the same document
from the portal (``/portal/catalogue/openapi.json``), where the people who
write the receivers are.
"""

from __future__ import annotations

import json

from aiohttp import web

from hooklane import store
from hooklane.api import inputs
from hooklane.api.auth import Audience, audience, connection, route
from hooklane.api.context import SETTINGS
from hooklane.api.errors import problem
from hooklane.catalogue_openapi import export_title, openapi_document
from hooklane.catalogue_view import CatalogueEntry, entry_json
from hooklane.checks import EVENT_TYPE
from hooklane.settings import Settings

OPENAPI_PATH = "/v1/catalogue/openapi.json"
_DEFAULT_TYPES = 100
_MAX_TYPE_CHARS = 255


def add_routes(app: web.Application) -> None:
    """Add the catalogue's routes under the admin and the tenant prefixes,
    and the export."""
    router = app.router
    for prefix, who in (("/v1/admin", Audience.ADMIN), ("/v1/tenant", Audience.TENANT)):
        router.add_get(prefix + "/catalogue", route(who, list_catalogue))
        router.add_get(prefix + "/catalogue/{type}", route(who, get_catalogue_type))
    router.add_get(OPENAPI_PATH, catalogue_openapi)


_BOTH = (Audience.ADMIN, Audience.TENANT)


@audience(*_BOTH)
async def list_catalogue(request: web.Request) -> web.Response:
    query = request.query
    group = store.check_catalogue_filter(query.get("group"), "group")
    prefix = store.check_catalogue_filter(query.get("name_prefix"), "name_prefix")
    limit = inputs.limit(query, _DEFAULT_TYPES)
    cursor = query.get("cursor") or None
    store.catalogue_position(cursor)
    async with connection(request) as conn:
        page = await store.catalogue_page(conn, group=group, name_prefix=prefix, cursor=cursor, limit=limit)
    return web.json_response({"types": [entry_json(e) for e in page.types], "next_cursor": page.cursor})


@audience(*_BOTH)
async def get_catalogue_type(request: web.Request) -> web.Response:
    name = request.match_info["type"]
    found = None
    if len(name) <= _MAX_TYPE_CHARS and EVENT_TYPE.fullmatch(name):
        async with connection(request) as conn:
            found = await store.catalogue_type(conn, name)
    if found is None:
        return problem(404, "not_found", f"the catalogue has no event type {name!r}", field="type")
    return web.json_response(entry_json(found))


@audience(Audience.ADMIN)
async def catalogue_openapi(request: web.Request) -> web.Response:
    async with connection(request) as conn:
        entries = await store.catalogue_entries(conn)
    return openapi_response(request.app[SETTINGS], entries)


def openapi_response(settings: Settings, entries: list[CatalogueEntry]) -> web.Response:
    """The export as an answer: the API's route and the portal's."""
    document = openapi_document(entries, title=export_title(settings.portal_name))
    return web.Response(
        text=json.dumps(document, indent=2, ensure_ascii=False) + "\n",
        content_type="application/json",
        headers={"Cache-Control": "no-cache"},
    )
