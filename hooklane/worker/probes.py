"""The worker's HTTP port: Prometheus metrics and the Kubernetes probes.

It runs in the worker's own event loop on purpose: a loop that is stuck
stops answering ``/healthz``, and that is what the liveness probe is for.
"""

from __future__ import annotations

from collections.abc import Callable

from aiohttp import web

from hooklane.metrics import exposition


def application(ready: Callable[[], bool]) -> web.Application:
    async def healthz(_request: web.Request) -> web.Response:
        return web.Response(text="ok\n")

    async def readyz(_request: web.Request) -> web.Response:
        if ready():
            return web.Response(text="ready\n")
        return web.Response(
            status=503, text="not ready: no database, or partitions not settled, or draining\n"
        )

    app = web.Application()
    app.router.add_get("/metrics", exposition)
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/readyz", readyz)
    return app


async def serve(ready: Callable[[], bool], host: str, port: int) -> web.AppRunner:
    """Start serving; the caller cleans up the returned runner. Raises
    OSError when the port cannot be bound."""
    runner = web.AppRunner(application(ready), access_log=None)
    await runner.setup()
    try:
        await web.TCPSite(runner, host, port).start()
    except BaseException:
        await runner.cleanup()
        raise
    return runner
