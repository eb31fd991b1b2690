"""The API's error answers: one JSON shape for every refusal.

``{"error": code, "detail": words, "field": name}``: ``code`` is stable
for programs, ``detail`` is for people, ``field`` names the input at fault
when there is one.
"""

from __future__ import annotations

from collections.abc import Mapping

from aiohttp import web


def problem(
    status: int,
    code: str,
    detail: str,
    field: str | None = None,
    headers: Mapping[str, str] | None = None,
) -> web.Response:
    body: dict[str, str] = {"error": code, "detail": detail}
    if field is not None:
        body["field"] = field
    return web.json_response(body, status=status, headers=headers)
