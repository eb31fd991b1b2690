"""The Kubernetes API as the operator and the API's endpoint writer reach
it: one login and the paths of the resources they write, and the client
the writer calls through.

The image ships no Kubernetes client library (it would be a third of its
size), so kopf's own logins serve there: the Pod's ServiceAccount, else
KUBECONFIG. Where the ``kubernetes`` package is installed, the operator
uses its login, which also understands kubeconfig exec plugins (EKS,
GKE). The operator hands :func:`login` to kopf, whose client then makes
the operator's calls; :class:`Client` logs in with :func:`plain_login`.
"""

from __future__ import annotations

import asyncio
import dataclasses
import importlib.util
import logging
import os
import ssl
from collections.abc import Callable
from typing import Any

import aiohttp
import kopf

from hooklane.crd import GROUP, PLURAL, VERSION

logger = logging.getLogger(__name__)

# A 429 is tried again this many times in all, waiting its Retry-After,
# at most this long each time.
_TRIES = 4
_LONGEST_RETRY_AFTER = 2.0


def login(**kwargs: Any) -> kopf.ConnectionInfo | None:
    """The operator's login handler (``kwargs`` are kopf's: ``settings``,
    ``logger``): :func:`plain_login`, or the ``kubernetes`` package's where
    it is installed."""
    if importlib.util.find_spec("kubernetes") is not None:
        return kopf.login_via_client(**kwargs)
    return plain_login(**kwargs)


def plain_login(**kwargs: Any) -> kopf.ConnectionInfo | None:
    """In a Pod, the ServiceAccount; elsewhere KUBECONFIG, read at each
    login. :class:`Client`'s login even where the ``kubernetes`` package is
    installed: that package reads KUBECONFIG's path once per process and
    sets a configuration for the whole process."""
    in_cluster = kopf.login_with_service_account(**kwargs)
    if in_cluster is None:
        return kopf.login_with_kubeconfig(**kwargs)
    # kopf names the API server kubernetes.default.svc; like client-go's
    # in-cluster config, take the address kubelet puts in every container's
    # environment, so that no cluster DNS is needed.
    host, port = os.environ.get("KUBERNETES_SERVICE_HOST"), os.environ.get("KUBERNETES_SERVICE_PORT")
    if not host or not port:
        return in_cluster
    host = f"[{host}]" if ":" in host else host
    return dataclasses.replace(in_cluster, server=f"https://{host}:{port}")


def endpoints_path(namespace: str, name: str = "", subresource: str = "") -> str:
    """The WebhookEndpoints of ``namespace``, one of them, or its subresource."""
    path = f"/apis/{GROUP}/{VERSION}/namespaces/{namespace}/{PLURAL}"
    return path + "".join(f"/{part}" for part in (name, subresource) if part)


def secrets_path(namespace: str, name: str = "") -> str:
    return f"/api/v1/namespaces/{namespace}/secrets" + (f"/{name}" if name else "")


class Client:
    """The calls of a role that runs no kopf, over aiohttp, logged in by
    :func:`plain_login`. A 401 logs in again once: the kubelet rotates a
    ServiceAccount token in its file. ``action`` tags its log lines;
    ``unavailable`` is what it raises when the API server cannot be
    reached, does not answer in time or answers no JSON, or there is no
    way to log in (the call may or may not have been made)."""

    def __init__(self, timeout: float, action: str, unavailable: Callable[[], Exception]) -> None:
        self._timeout = aiohttp.ClientTimeout(total=timeout)
        self._extra = {"action": action}
        self._unavailable = unavailable
        self._login: tuple[kopf.ConnectionInfo, ssl.SSLContext] | None = None

    async def call(
        self,
        method: str,
        path: str,
        body: Any = None,
        *,
        patch: bool = False,
        query: dict[str, str] | None = None,
    ) -> tuple[int, dict[str, Any]]:
        """The status and the JSON answer of one call. ``patch``: ``body`` is
        a JSON patch. A 401 logs in again, once; a 429 (an API server busy,
        or still starting) is tried again after its Retry-After, a few
        times."""
        relogged, tries = False, 0
        while True:
            if self._login is None:
                self._login = await self._logged_in()
            status, answer, retry_after = await self._send(self._login, method, path, body, patch, query)
            tries += 1
            if status == 401 and not relogged:
                self._login, relogged = None, True
            elif status == 429 and tries < _TRIES:
                await asyncio.sleep(retry_after)
            else:
                return status, answer

    async def _send(
        self,
        login: tuple[kopf.ConnectionInfo, ssl.SSLContext],
        method: str,
        path: str,
        body: Any,
        patch: bool,
        query: dict[str, str] | None,
    ) -> tuple[int, dict[str, Any], float]:
        info, context = login
        headers = {
            **info.as_http_headers(),
            "Content-Type": "application/json-patch+json" if patch else "application/json",
        }
        try:
            async with (
                aiohttp.ClientSession(timeout=self._timeout) as http,
                http.request(
                    method,
                    info.server.rstrip("/") + path,
                    json=body,
                    params=query,
                    headers=headers,
                    ssl=context,
                ) as response,
            ):
                answer = await response.json(content_type=None)
                if not isinstance(answer, dict):
                    raise ValueError(f"answered {response.status} without a JSON object")
                wait = response.headers.get("Retry-After", "")
                retry_after = min(float(wait) if wait.isdigit() else 1.0, _LONGEST_RETRY_AFTER)
                return response.status, answer, retry_after
        except (aiohttp.ClientError, TimeoutError, ValueError) as exc:
            logger.warning("Kubernetes API: %s %s: %s", method, path, exc or "timed out", extra=self._extra)
            raise self._unavailable() from None

    async def _logged_in(self) -> tuple[kopf.ConnectionInfo, ssl.SSLContext]:
        try:
            return await asyncio.to_thread(_connection)
        except Exception as exc:
            # kopf reads a kubeconfig as it is: a malformed one raises
            # whatever its shape makes it raise (a KeyError, a YAML error).
            logger.error("Kubernetes API: cannot log in: %s", exc, extra=self._extra)
            raise self._unavailable() from None


def _connection() -> tuple[kopf.ConnectionInfo, ssl.SSLContext]:
    info = plain_login(settings=kopf.OperatorSettings())
    if info is None:
        raise kopf.LoginError("neither a ServiceAccount token nor KUBECONFIG")
    return info, info.as_ssl_context()
