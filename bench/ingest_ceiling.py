"""The ceiling of ``bench/ingest.py``: the ingest routes of ``hooklane api``
without the database.

The same aiohttp server, token check and request handling
(``hooklane.api.ingest.receive``: content type, length, read, JSON, the
event checks, the grant) answering 202 with the ids, but committing nothing:
what is left of the API's time per event is the commit's. A bench-only
server, not a mode of the product.

Run: ``python -m bench.ingest_ceiling --port 8081 --token ...``
"""

from __future__ import annotations

import argparse
import asyncio

import uvloop
from aiohttp import web

from hooklane.api import ingest
from hooklane.api.auth import Audience, audience, authenticate
from hooklane.api.context import ADMIN_TOKENS, INGEST_TOKENS, SETTINGS, set_started
from hooklane.api.tokens import TokenSource
from hooklane.errors import InvalidInput
from hooklane.settings import Settings
from hooklane.tokens import Tokens


@audience(Audience.INGEST)
async def publish_one(request: web.Request) -> web.Response:
    return await _accept(request, batch=False)


@audience(Audience.INGEST)
async def publish_batch(request: web.Request) -> web.Response:
    return await _accept(request, batch=True)


async def _accept(request: web.Request, *, batch: bool) -> web.Response:
    set_started(request)
    try:
        return ingest.accepted(await ingest.receive(request, batch=batch))
    except (ingest.Refused, InvalidInput) as exc:
        return ingest.refusal(exc)[1]


def make_app(token: str) -> web.Application:
    settings = Settings(database_url="postgresql://unused/none")
    app = web.Application(middlewares=[authenticate], client_max_size=settings.api_max_body_bytes)
    app[SETTINGS] = settings
    app[INGEST_TOKENS] = TokenSource(Tokens.parse(token, "--token"), None, "--token")
    app[ADMIN_TOKENS] = TokenSource(Tokens(), None, "--token")
    app.router.add_post(ingest.EVENTS_PATH, publish_one)
    app.router.add_post(ingest.BATCH_PATH, publish_batch)
    return app


async def serve(port: int, token: str) -> None:
    runner = web.AppRunner(make_app(token), access_log=None)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    await asyncio.Event().wait()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--token", required=True)
    args = parser.parse_args()
    # The event loop `hooklane api` runs on (hooklane/cli.py).
    uvloop.run(serve(args.port, args.token))


if __name__ == "__main__":
    main()
