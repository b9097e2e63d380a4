"""Connecting a driver (the deploy CLI) to Ray, with Ray's token authentication handled.

Ray 2.60 clusters check a token on every connection: ``ray start --head`` turns token auth on when a
token exists (``~/.ray/auth_token``, made by any earlier local ``ray.init()``), and a local
``ray.init()`` turns it on by default. A driver sends its token only in token mode, and Ray switches a
driver to token mode by itself only when it finds the cluster through ``address="auto"``/``None``;
with an explicit address (``--address`` or ``RAY_ADDRESS``) it needs ``RAY_AUTH_MODE=token`` or the
cluster answers ``InvalidAuthToken`` (https://docs.ray.io/en/latest/ray-security/token-auth.html).

:func:`auth_env` applies Ray's own rule to an explicit address too, for the cases where the token is
known to be the cluster's: a token the user gave (``RAY_AUTH_TOKEN`` / ``RAY_AUTH_TOKEN_PATH``), or
``~/.ray/auth_token`` for a cluster on this machine. A remote cluster is never sent the local token
file unasked; if it refuses the connection, :class:`RayAuthError` says exactly what to set.
"""
from __future__ import annotations

import os
import socket
from collections.abc import Mapping
from pathlib import Path

from orchestrator.errors import OrchestratorError

__all__ = ["RayAuthError", "auth_env", "auth_help", "connect", "is_this_host"]

AUTH_MODE = "RAY_AUTH_MODE"
TOKEN_VARS = ("RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH")


class RayAuthError(OrchestratorError, ConnectionError):
    """The Ray cluster refused this driver's connection for want of the right token."""


def auth_help(address: str) -> str:
    """What to set so a driver can connect to a token-checking cluster at ``address``."""
    return (
        f"the Ray cluster at {address} refused the connection: it checks a token (Ray's token "
        "authentication) and this command sent none or a wrong one. Set\n"
        "    RAY_AUTH_MODE=token\n"
        "and give the cluster's token (print it on the head node with `ray get-auth-token`) as\n"
        "    RAY_AUTH_TOKEN=<token>   or   RAY_AUTH_TOKEN_PATH=<file holding it>   (default ~/.ray/auth_token)\n"
        "then run this command again. A cluster started with RAY_AUTH_MODE=disabled needs no token "
        "(only on a network you trust). See https://docs.ray.io/en/latest/ray-security/token-auth.html"
    )


def is_this_host(host: str) -> bool:
    """Whether ``host`` names this machine (loopback, or an address one of its interfaces holds)."""
    host = host.strip("[]")
    if host in ("localhost", "") or host.startswith("127.") or host == "::1":
        return True
    try:
        infos = socket.getaddrinfo(host, None, type=socket.SOCK_STREAM)
    except OSError:
        return False
    for family, _, _, _, sockaddr in infos:
        try:
            with socket.socket(family, socket.SOCK_STREAM) as s:
                s.bind((sockaddr[0], 0))  # only an address of this machine can be bound
            return True
        except OSError:
            continue
    return False


def _host_of(address: str) -> str:
    hostport = address.split("://", 1)[-1].split("/", 1)[0]
    if hostport.startswith("["):
        return hostport[1:].split("]", 1)[0]
    return hostport.rsplit(":", 1)[0] if hostport.count(":") == 1 else hostport


def auth_env(address: str | None, environ: Mapping[str, str], home: Path) -> dict[str, str]:
    """The environment to add before ``ray.init(address=address)`` (empty: nothing to change).

    ``RAY_AUTH_MODE`` already set is the user's choice and kept. ``None``/``auto``/``local`` are Ray's
    own business (it finds the token itself).
    """
    if AUTH_MODE in environ or address in (None, "", "auto", "local") or address.startswith("ray://"):
        return {}
    if any(environ.get(v) for v in TOKEN_VARS):
        return {AUTH_MODE: "token"}
    if (home / ".ray" / "auth_token").is_file() and is_this_host(_host_of(address)):
        return {AUTH_MODE: "token"}
    return {}


def _refused_for_auth(e: BaseException) -> bool:
    seen: set[int] = set()
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        text = f"{type(e).__name__}: {e}"
        if "InvalidAuthToken" in text or "AuthenticationError" in text or "Unauthenticated" in text:
            return True
        e = e.__cause__ or e.__context__
    return False


def connect(address: str | None) -> None:
    """``ray.init(address=address)`` with the token handled (:func:`auth_env`).

    Raises:
        RayAuthError: the cluster refused the token (the message says what to set).
    """
    import ray

    from orchestrator.raycompat import enable_token_auth

    if auth_env(address or os.environ.get("RAY_ADDRESS"), os.environ, Path.home()).get(AUTH_MODE) == "token":
        enable_token_auth()
    try:
        ray.init(address=address, ignore_reinit_error=True)
    except (ConnectionError, RuntimeError) as e:
        if _refused_for_auth(e):
            raise RayAuthError(auth_help(address or os.environ.get("RAY_ADDRESS", "auto"))) from None
        raise
