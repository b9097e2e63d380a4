"""The project's calls into private Ray (and prometheus_client) APIs, in one place.

Each function wraps one private name and says why the public API does not do the job. A Ray upgrade
that renames or drops one of them fails ``tests/unit/test_raycompat.py`` (which asserts the name and the
parameters used here still exist and still behave as relied on) instead of a deployed router.
Nothing else in the project imports a private Ray or prometheus_client name.
"""
from __future__ import annotations

from typing import Any

__all__ = ["driver_started_cluster", "enable_token_auth", "serve_client", "stream_handle", "with_deployment_version"]


def stream_handle(handle: Any, *, by_reference: bool, **options: Any) -> Any:
    """``handle.options(stream=True, _by_reference=by_reference, **options)``.

    Why private: ``_by_reference=False`` is the only way to make a Serve handle call go over the
    engine replica's inter-deployment gRPC server instead of Ray's streaming generator (one object
    reference per streamed chunk). Serve has no public switch for it; ``request_serialization`` /
    ``response_serialization`` (public) only apply on that path.
    """
    return handle.options(stream=True, _by_reference=by_reference, **options)


def with_deployment_version(deployment: Any, version: str) -> Any:
    """``deployment.options(version=version, _internal=True)``, or ``deployment`` unchanged if Serve
    no longer accepts it.

    Why private: Serve's public ``Deployment.options`` refuses ``version=`` ("Serve manages deployment
    versions internally") and then gives every ``serve.run`` a random version, which restarts every
    engine on each deploy. ``_internal=True`` is the path Serve's own declarative deploys take to set
    the version, so an engine whose config did not change keeps running through a table update.
    Without it the fallback is correct, only slower (every update restarts every engine).
    """
    try:
        return deployment.options(version=version, _internal=True)
    except (TypeError, ValueError):  # pragma: no cover - Serve dropped the internal path
        return deployment


def serve_client() -> Any:
    """Serve's controller client on the connected Ray cluster, or ``None`` when Serve is not running
    (connects the driver to Ray first if it is not connected).

    Why private: ``ray.serve.context._get_global_client`` is what ``serve.status()`` uses; the public
    ``serve.status()`` returns only a summary, while deploy needs the controller's full
    ``get_serve_details()`` document (its schema ``ray.serve.schema.ServeInstanceDetails`` is public):
    router replicas' direct-ingress targets and running replica counts.
    """
    from ray.serve.context import _get_global_client

    return _get_global_client(raise_if_no_controller_running=False)


def driver_started_cluster() -> bool:
    """Whether this process's ``ray.init()`` started the Ray cluster it is connected to (a local
    cluster that stops when this process exits) rather than connecting to a running one.

    Why private: ``ray.init()`` without an address connects to a cluster ``ray start`` left running
    or starts a new one, and says which only in a log line; the driver's node object
    (``ray._private.worker._global_node``) is a head node exactly when this process started it. The
    deploy CLI stays in the foreground in that case, since its exit would stop the app it deployed.
    """
    import ray
    from ray._private import worker

    node = getattr(worker, "_global_node", None)
    return bool(ray.is_initialized() and node is not None and node.head)


def enable_token_auth() -> None:
    """Switch this process (and the processes it starts) to Ray's token authentication mode:
    ``RAY_AUTH_MODE=token`` plus a refresh of Ray's cached config.

    Why private: Ray reads ``RAY_AUTH_MODE`` into its C++ config once, when ``ray`` is imported; a
    driver that imported Ray before deciding (the deploy CLI imports Serve to validate the table
    first) must refresh that config, which is what Ray's own
    ``authentication_token_setup._enable_token_auth`` does for ``ray.init(address="auto")``.
    """
    from ray._private.authentication import authentication_token_setup

    authentication_token_setup._enable_token_auth()
