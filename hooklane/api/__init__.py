"""``hooklane api``: the HTTP face of Hooklane.

One aiohttp application per process. Producers publish through the ingest
routes (``/v1/events``), the platform's operators inspect and repair
deliveries through the admin routes (``/v1/admin``) and the dashboard
(``/dashboard``); each audience has its own tokens. Every statement goes
through :mod:`hooklane.store`, like the CLI's and the operator's.
"""
