"""``python -m orchestrator.deploy``: serve a routing table with Ray Serve, or write the Serve config.

Deploy (imperative, zero-drop update)::

    python -m orchestrator.deploy --routing-table results/routing.json [--address auto] \\
        [--scale le1024=1:4:32] [--scaling scaling.yaml] [--api-key-file keys.txt]

Write a config for ``serve deploy`` (declarative)::

    python -m orchestrator.deploy --routing-table results/routing.json --write-serve-config serve.yaml
    serve deploy serve.yaml

The table is loaded and validated first; an invalid table, scaling or argument exits with status 2
before anything on the cluster is touched, and the running application stays as it was.

Where it runs and who can reach it:

- **Cluster**: ``--address`` / ``RAY_ADDRESS``, else a cluster ``ray start`` left running on this
  machine, else a new local cluster. That last one lives only as long as this command, so the command
  then stays in the foreground until Ctrl-C (``--no-blocking`` exits anyway); with a cluster of its
  own the app stays deployed and the command returns.
- **Token**: Ray 2.60 clusters check a token; :mod:`orchestrator.raycluster` sends the local
  ``~/.ray/auth_token`` to a cluster on this machine, and says exactly what to set otherwise.
- **Listening**: Serve's proxy binds ``127.0.0.1`` unless ``--http-host`` says otherwise
  (``0.0.0.0``: every interface; a warning when no API key is set).
- After deploying it prints a first request with curl and with the openai client.

Updating a running app goes in three ``serve.run`` steps, so neither in-flight nor new requests are
dropped even when every engine config changes:

1. *add*: the running router (rebuilt from its own spec, which it reports) plus the old **and** new
   engine deployments; new engines load while the old router keeps serving. Returns once they are up.
   This is the update's peak: it is checked against the cluster first (a new engine that cannot be
   placed would leave this step waiting for ever), and refused with the running app untouched.
2. *switch*: the new router (new table) plus old and new engines. Serve starts the new router replicas
   before stopping old ones (``max_surge_percent``); old router replicas drain their streams.
3. *remove*: the new router and only the new engines. Serve drains the removed engines' in-flight
   requests (``graceful_shutdown_timeout_s``) before stopping them and their engine processes.

Engines whose config is in both tables keep running through all three steps (same deployment name
and version). ``serve deploy`` with a changed config instead rebuilds everything at once: in-flight
requests still finish, but new requests may fall back or get 503 while new engines load.

Direct ingress (the low-latency mode: no proxy hop)
---------------------------------------------------
Serve's HTTP proxy (``--http-host``/``--http-port``) is one extra hop per request. With Ray Serve
*direct ingress* each router replica serves HTTP itself, on a port of its own from
``RAY_SERVE_DIRECT_INGRESS_MIN_HTTP_PORT`` (default 30000) to ``..._MAX_HTTP_PORT`` (31000), bound to
the same ``--http-host``. It is a cluster setting, not a deploy option: put
``RAY_SERVE_ENABLE_DIRECT_INGRESS=1`` (``RAY_SERVE_THROUGHPUT_OPTIMIZED=1`` also turns it on) in
the environment of every ``ray start`` (head and workers) before Serve starts; for the local cluster
this CLI starts, in its own environment. After a deploy the CLI prints each router replica's URL
(:func:`direct_ingress_urls`); the proxy URL keeps working as a fallback. Replica ports change when
replicas are replaced, so clients or a load balancer should re-read them (or put Serve's HAProxy,
``RAY_SERVE_ENABLE_HA_PROXY=1``, in front of them).
"""
from __future__ import annotations

import argparse
import hashlib
import json
import logging
import shlex
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from orchestrator.errors import ConfigError, OrchestratorError
from orchestrator.raycompat import serve_client

__all__ = ["DeployResult", "deploy", "deploy_many", "direct_ingress_urls", "direct_ingress_urls_from_details", "first_request_text",
           "main", "serve_config", "write_serve_config"]

logger = logging.getLogger(__name__)

DEFAULT_APP_NAME = "mtp-router"
LOOPBACK = "127.0.0.1"
"""Serve's HTTP proxy listens here unless ``--http-host`` says otherwise: nothing is public by default."""


@dataclass(frozen=True)
class DeployResult:
    app_name: str
    table_version: int
    engine_deployments: tuple[str, ...]
    steps: tuple[str, ...] = field(default=())
    added: tuple[str, ...] = ()
    removed: tuple[str, ...] = ()


def deploy(
    args: Any,
    *,
    app_name: str = DEFAULT_APP_NAME,
    route_prefix: str = "/",
) -> DeployResult:
    """Deploy (or update to) the table in ``args`` on the connected Ray cluster.

    Raises:
        ConfigError / RoutingTableError: invalid args or table — nothing was changed.
    """
    from ray import serve

    import ray

    from orchestrator.serve.app import (
        AppArgs,
        RunningEngine,
        build_app,
        check_free,
        check_resources,
        load_table,
        resources_needed,
        router_spec,
    )
    from orchestrator.serve.router import RouterSpec
    from orchestrator.table import parse

    args = AppArgs.parse(args)
    table = load_table(args)
    build_app(args, table=table)  # validates every option; builds no actors
    new_engines = table.distinct_configs()
    old_spec = _running_router_spec(app_name)
    old_router = RouterSpec.from_dict(old_spec) if old_spec is not None else None
    old_engines = parse(old_router.table_json).distinct_configs() if old_router is not None else {}
    # Before anything on the cluster changes; an update's running engines keep their GPUs until the
    # switch, so the new ones must fit beside them.
    counts = _running_replicas(app_name) if old_engines else {}
    check_resources(args, table, ray.cluster_resources(),
                    running={k: RunningEngine(c, counts.get(k, 1)) for k, c in old_engines.items()})
    if old_router is None:
        check_free([resources_needed(args, table)], ray.available_resources())
        serve.run(build_app(args, table=table), name=app_name, route_prefix=route_prefix)
        return DeployResult(app_name, table.version, tuple(sorted(new_engines)), ("run",), tuple(sorted(new_engines)))

    added = sorted(set(new_engines) - set(old_engines))
    removed = sorted(set(old_engines) - set(new_engines))
    steps: list[str] = []
    if added:
        logger.info("step 1/3: starting engines %s behind the running router", added)
        serve.run(build_app(args, table=table, router=old_router, extra_engines=old_engines), name=app_name,
                  route_prefix=route_prefix)
        steps.append("add")
    if router_spec(args, table) != old_router or added:
        logger.info("step 2/3: switching the router to table v%d", table.version)
        serve.run(build_app(args, table=table, extra_engines=old_engines), name=app_name, route_prefix=route_prefix)
        steps.append("switch")
    if removed or not steps:
        logger.info("step 3/3: removing engines %s (they drain in-flight requests first)", removed)
        serve.run(build_app(args, table=table), name=app_name, route_prefix=route_prefix)
        steps.append("remove")
    return DeployResult(app_name, table.version, tuple(sorted(new_engines)), tuple(steps), tuple(added), tuple(removed))


def deploy_many(apps: Sequence[tuple[Any, str, str]]) -> list[DeployResult]:
    """Deploy several apps that are not running yet, ``(args, app_name, route_prefix)`` each, and return
    once all of them run.

    Their engines start side by side: :func:`deploy` returns only when an app's engines are up, so apps
    deployed one after another start one after another (a benchmark that keeps several apps of real
    engines resident on one host waits minutes longer). Every app is validated, alone and all of them
    together checked against the cluster (GPUs by placement, CPUs by sum), before anything on the
    cluster changes. An app that is already running is refused: updating one is :func:`deploy`'s
    three steps.

    Raises:
        ConfigError / RoutingTableError: no app, an invalid app, a name or route prefix given twice or
            already running, or apps that do not fit together — nothing was changed.
    """
    from ray import serve

    import ray
    from orchestrator.config import gpus_needed
    from orchestrator.serve.app import (
        AppArgs,
        build_app,
        check_free,
        check_resources,
        gpu_requests,
        load_table,
        resources_needed,
    )

    if not apps:
        raise ConfigError("no app to deploy")
    names, prefixes = [name for _, name, _ in apps], [prefix for *_, prefix in apps]
    if len(set(names)) != len(names):
        raise ConfigError(f"each app needs a name of its own, got {names}")
    client = serve_client()
    taken = {app: d.get("route_prefix") for app, d in
             ((client.get_serve_details() if client is not None else {}).get("applications") or {}).items()}
    clash = sorted({p for p in prefixes if prefixes.count(p) > 1} | {p for p in prefixes if p in taken.values()})
    if clash:
        raise ConfigError(f"route prefix(es) {clash} given twice or served by a running app "
                          f"({ {a: p for a, p in taken.items() if p in clash} }): give each app a prefix of its own")
    cluster = ray.cluster_resources()
    parsed = []
    for raw, name, prefix in apps:
        args = AppArgs.parse(raw)
        table = load_table(args)
        build_app(args, table=table)  # validates every option; builds no actors
        if _running_router_spec(name) is not None:
            raise ConfigError(f"app {name!r} is running already: update it with deploy()")
        check_resources(args, table, cluster)
        parsed.append((args, table, name, prefix))
    placed = gpus_needed([r for args, table, *_ in parsed for r in gpu_requests(args, table)])
    needs = [resources_needed(args, table) for args, table, *_ in parsed]
    cpus = sum(n["CPU"] for n in needs)
    have_gpus, have_cpus = float(cluster.get("GPU", 0.0)), float(cluster.get("CPU", 0.0))
    if placed > have_gpus + 1e-9 or cpus > have_cpus + 1e-9:
        raise ConfigError(f"the {len(parsed)} apps together take {placed} GPU(s) once placed and reserve {cpus:g} "
                          f"CPU(s); the Ray cluster has {have_gpus:g} GPU(s) and {have_cpus:g} CPU(s): deploy fewer "
                          "apps at once, or lower their reservations")
    check_free(needs, ray.available_resources(),
               what="the app" if len(parsed) == 1 else f"the {len(parsed)} apps together")
    serve.run_many([serve.RunTarget(target=build_app(args, table=table), name=name, route_prefix=prefix)
                    for args, table, name, prefix in parsed])
    return [DeployResult(name, table.version, tuple(sorted(table.distinct_configs())), ("run",),
                         tuple(sorted(table.distinct_configs()))) for args, table, name, _ in parsed]


def _running_replicas(app_name: str) -> dict[str, int]:
    """Replicas of each deployment of ``app_name`` that hold resources now (any state but stopped:
    a starting or stopping replica has its GPUs too); empty when Serve cannot say."""
    from ray import serve

    try:
        app = serve.status().applications.get(app_name)
    except Exception as e:  # noqa: BLE001 - the check then counts one replica per engine
        logger.warning("could not read the running app's replica counts (%r)", e)
        return {}
    if app is None:
        return {}
    return {name: sum(n for state, n in d.replica_states.items() if str(getattr(state, "value", state)) != "STOPPED")
            for name, d in app.deployments.items()}


def _running_router_spec(app_name: str) -> dict[str, Any] | None:
    """The spec of the router now serving ``app_name``, or ``None`` if the app is not running."""
    from ray import serve

    from orchestrator.serve.app import ROUTER_DEPLOYMENT

    app = serve.status().applications.get(app_name)
    if app is None or ROUTER_DEPLOYMENT not in app.deployments:
        return None
    try:
        handle = serve.get_deployment_handle(ROUTER_DEPLOYMENT, app_name=app_name)
        return handle.deployed_spec.remote().result(timeout_s=60)
    except Exception as e:
        logger.warning("could not read the running router's spec (%r); deploying without the add step", e)
        return None


_WILDCARD_HOSTS = frozenset({"0.0.0.0", "::", ""})


def direct_ingress_urls_from_details(details: Mapping[str, Any], app_name: str = DEFAULT_APP_NAME, *,
                                     deployment: str | None = None) -> list[str]:
    """The OpenAI base URLs (``http://IP:PORT[/prefix]/v1``) of ``app_name``'s router replicas that
    serve HTTP themselves (Ray Serve direct ingress); empty when direct ingress is off or no router
    replica is running yet. Pure: reads a Serve instance details document and nothing else.

    ``details``: the ``ServeInstanceDetails`` document — what Serve's controller returns
    (``get_serve_instance_details``, which ``serve.status()`` also reads) and what the dashboard serves
    at ``GET /api/serve/applications/``. Its ``target_groups`` list, per app and protocol, where
    traffic can enter: with direct ingress on, the ingress replicas' node IP and own port; otherwise
    (or while the app has no running ingress replica) Serve's proxies. Only targets that are replicas
    of the router ``deployment`` (default :data:`orchestrator.serve.app.ROUTER_DEPLOYMENT`) of this
    app are kept, which leaves the proxies out.

    A replica binds the host of Serve's ``http_options`` on its own node: for ``0.0.0.0``/``::`` the
    URL names the node's IP; for any other host (``127.0.0.1``: reachable only on that node) that host.
    """
    if deployment is None:
        from orchestrator.serve.app import ROUTER_DEPLOYMENT

        deployment = ROUTER_DEPLOYMENT
    app = (details.get("applications") or {}).get(app_name) or {}
    dep = (app.get("deployments") or {}).get(deployment) or {}
    replicas = {r.get("actor_name") for r in dep.get("replicas") or () if r.get("actor_name")}
    # An unset host is Serve's default: the loopback address of each node.
    host = str((details.get("http_options") or {}).get("host", "127.0.0.1") or "")
    urls: set[str] = set()
    for group in details.get("target_groups") or ():
        if group.get("app_name") != app_name or _enum_value(group.get("protocol")).upper() != "HTTP":
            continue
        prefix = str(group.get("route_prefix") or "/").rstrip("/")
        for target in group.get("targets") or ():
            if target.get("name") not in replicas or not target.get("port"):
                continue  # a proxy, not a router replica
            ip = str(target.get("ip") or "") if host in _WILDCARD_HOSTS else host
            if not ip:
                continue
            urls.add(f"http://{_url_host(ip)}:{int(target['port'])}{prefix}/v1")
    return sorted(urls, key=_url_sort_key)


def direct_ingress_urls(app_name: str = DEFAULT_APP_NAME) -> list[str]:
    """The direct-ingress URLs of ``app_name``'s running router replicas on the connected Ray cluster
    (:func:`direct_ingress_urls_from_details`); empty when direct ingress is off, Serve is not running
    or the app is not deployed.

    Reads the controller's ``get_serve_instance_details`` through Serve's client, the same call
    ``serve.status()`` makes (:func:`orchestrator.raycompat.serve_client`; the document's
    schema ``ray.serve.schema.ServeInstanceDetails`` is public); no port is probed. Outside a Ray driver,
    feed the dashboard's ``GET /api/serve/applications/`` JSON to
    :func:`direct_ingress_urls_from_details` instead.
    """
    client = serve_client()
    if client is None:
        return []
    return direct_ingress_urls_from_details(client.get_serve_details(), app_name)


def _enum_value(v: Any) -> str:
    return str(getattr(v, "value", v) or "")


def _url_host(ip: str) -> str:
    return f"[{ip}]" if ":" in ip and not ip.startswith("[") else ip


def _url_sort_key(url: str) -> tuple[str, int]:
    hostport = url.split("://", 1)[1].split("/", 1)[0]
    host, _, port = hostport.rpartition(":")
    return host, int(port)


def serve_config(args: Any, *, app_name: str = DEFAULT_APP_NAME, route_prefix: str = "/",
                 http_host: str = "127.0.0.1", http_port: int = 8000) -> dict[str, Any]:
    """A Serve config (``serve deploy`` schema) for the args; the table is validated and pinned by hash."""
    from orchestrator.serve.app import AppArgs, build_app, load_table

    args = AppArgs.parse(args)
    path = Path(args.routing_table).resolve()
    pinned = args.model_copy(update={
        "routing_table": str(path),
        "routing_table_sha256": hashlib.sha256(path.read_bytes()).hexdigest(),
    })
    build_app(pinned, table=load_table(pinned))  # refuse to write a config that would not build
    return {
        "proxy_location": "EveryNode",
        "http_options": {"host": http_host, "port": http_port},
        "applications": [{
            "name": app_name,
            "route_prefix": route_prefix,
            "import_path": "orchestrator.serve.app:app_builder",
            "args": pinned.public_dict(),
        }],
    }


def write_serve_config(path: str | Path, args: Any, **kwargs: Any) -> dict[str, Any]:
    config = serve_config(args, **kwargs)
    from orchestrator.fsutil import atomic_write_text

    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(p, (
        "# Written by python -m orchestrator.deploy; `serve deploy` this file. The routing table is pinned by\n"
        "# sha256: after committing a new table, write this file again.\n" + yaml.safe_dump(config, sort_keys=False)
    ))
    return config


# ----- CLI -----------------------------------------------------------------------------------------
def _parse_scale(items: Sequence[str]) -> dict[str, dict[str, Any]]:
    """``NAME=N`` (fixed replicas) or ``NAME=MIN:MAX:TARGET`` (autoscaling); NAME is ``default``, a
    bucket or a config key."""
    out: dict[str, dict[str, Any]] = {}
    for item in items:
        name, sep, value = item.partition("=")
        if not sep or not name:
            raise ConfigError(f"--scale {item!r}: expected NAME=N or NAME=MIN:MAX:TARGET")
        parts = value.split(":")
        try:
            if len(parts) == 1:
                out[name] = {"num_replicas": int(parts[0])}
            elif len(parts) == 3:
                out[name] = {"min_replicas": int(parts[0]), "max_replicas": int(parts[1]),
                             "target_ongoing_requests": float(parts[2])}
            else:
                raise ValueError
        except ValueError:
            raise ConfigError(f"--scale {item!r}: expected NAME=N or NAME=MIN:MAX:TARGET (integers, target a number)") from None
    return out


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m orchestrator.deploy",
        description="Serve a routing table with Ray Serve (one deployment per engine config + a routing ingress).",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="""\
low-latency mode (Ray Serve direct ingress, no proxy hop):
  a cluster setting, not an option of this command: start every Ray node with
      RAY_SERVE_ENABLE_DIRECT_INGRESS=1 [RAY_SERVE_THROUGHPUT_OPTIMIZED=1] ray start ...
  (RAY_SERVE_THROUGHPUT_OPTIMIZED=1 alone turns it on too; for the local cluster this command
  starts, set them in its own environment). Each router replica then serves HTTP on its own port
  (RAY_SERVE_DIRECT_INGRESS_MIN_HTTP_PORT.._MAX_HTTP_PORT, default 30000-31000) bound to
  --http-host; after deploying, this command prints their URLs ("router replicas (direct ingress,
  no proxy hop): http://IP:PORT/v1 ..."). The proxy URL keeps working.""",
    )
    p.add_argument("--routing-table", required=True, help="routing table JSON (orchestrator.table)")
    p.add_argument("--write-serve-config", metavar="FILE", help="write a `serve deploy` config and exit (no cluster needed)")
    p.add_argument("--app-name", default=DEFAULT_APP_NAME)
    p.add_argument("--route-prefix", default="/")
    p.add_argument("--address", default=None,
                   help="Ray address (default: RAY_ADDRESS, else a cluster `ray start` left running here, else a new "
                        "local cluster that lives as long as this command). A cluster that checks a token (Ray's "
                        "default) needs RAY_AUTH_MODE=token and RAY_AUTH_TOKEN[_PATH]; for one on this machine the "
                        "token in ~/.ray/auth_token is used")
    p.add_argument("--http-host", default=LOOPBACK,
                   help="interface Serve's HTTP proxy listens on (default %(default)s: this machine only); "
                        "0.0.0.0 serves every interface, i.e. other machines (use --api-key-file). Applies when "
                        "this command starts Serve; a running Serve keeps its own")
    p.add_argument("--http-port", type=int, default=8000)
    p.add_argument("--served-model-name", default=None)
    p.add_argument("--api-key-file", default=None, help="file with one accepted API key per line (stored as sha256)")
    p.add_argument("--sim-time-scale", type=float, default=None, help="simulated engines only")
    p.add_argument("--default-max-tokens", type=int, default=None)
    p.add_argument("--max-tokens-limit", type=int, default=None)
    p.add_argument("--scaling", default=None, help="YAML: {NAME: {num_replicas|min_replicas,max_replicas,target_ongoing_requests}}")
    p.add_argument("--scale", action="append", default=[], metavar="NAME=N|NAME=MIN:MAX:TARGET",
                   help="replicas per bucket / config key / 'default'; repeatable; overrides --scaling")
    p.add_argument("--router-replicas", type=int, default=None)
    p.add_argument("--health-check-period-s", type=float, default=None)
    p.add_argument("--graceful-shutdown-timeout-s", type=float, default=None)
    p.add_argument("--accept-length-low-threshold", type=float, default=None)
    p.add_argument("--engine-log-dir", default=None)
    p.add_argument("--share-gpu", action="store_true", help="tp=1 engines reserve memory_fraction + 0.1 of a GPU, "
                   "so several share one (small models only)")
    p.add_argument("--blocking", action=argparse.BooleanOptionalAction, default=None,
                   help="stay in the foreground after deploying until Ctrl-C. Default: only when this command "
                        "started the Ray cluster itself (its exit would stop the cluster and the app); "
                        "--no-blocking exits anyway")
    return p


def args_from_cli(ns: argparse.Namespace) -> dict[str, Any]:
    scaling: dict[str, Any] = {}
    if ns.scaling:
        loaded = yaml.safe_load(Path(ns.scaling).read_text()) or {}
        if not isinstance(loaded, dict):
            raise ConfigError(f"--scaling {ns.scaling}: expected a mapping of NAME -> scaling options")
        scaling.update(loaded)
    scaling.update(_parse_scale(ns.scale))
    out: dict[str, Any] = {"routing_table": ns.routing_table, "scaling": scaling}
    if ns.api_key_file:
        from orchestrator.serve.router import hash_api_key

        keys = [ln.strip() for ln in Path(ns.api_key_file).read_text().splitlines() if ln.strip()]
        if not keys:
            raise ConfigError(f"--api-key-file {ns.api_key_file} holds no keys")
        out["api_key_sha256"] = [hash_api_key(k) for k in keys]
    for arg, key in (("served_model_name", "served_model_name"), ("sim_time_scale", "sim_time_scale"),
                     ("default_max_tokens", "default_max_tokens"), ("max_tokens_limit", "max_tokens_limit")):
        if getattr(ns, arg) is not None:
            out[key] = getattr(ns, arg)
    engine: dict[str, Any] = {}
    for arg in ("health_check_period_s", "graceful_shutdown_timeout_s", "accept_length_low_threshold"):
        if getattr(ns, arg) is not None:
            engine[arg] = getattr(ns, arg)
    if ns.engine_log_dir:
        engine["log_dir"] = ns.engine_log_dir
    if ns.share_gpu:
        engine["share_gpu"] = True
    if engine:
        out["engine"] = engine
    if ns.router_replicas is not None:
        out["router"] = {"num_replicas": ns.router_replicas}
    return out


def main(argv: Sequence[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    ns = build_parser().parse_args(argv)
    try:
        from orchestrator.serve.app import AppArgs, build_app, load_table

        args = AppArgs.parse(args_from_cli(ns))
        table = load_table(args)  # refuse an invalid table before touching anything
        if ns.write_serve_config:
            write_serve_config(ns.write_serve_config, args, app_name=ns.app_name, route_prefix=ns.route_prefix,
                               http_host=ns.http_host, http_port=ns.http_port)
            print(f"wrote {ns.write_serve_config}; deploy it with: serve deploy {ns.write_serve_config}")
            return 0
        build_app(args, table=table)
    except (OrchestratorError, OSError, yaml.YAMLError) as e:
        print(f"error: {e}\nNothing was deployed; the running application (if any) is unchanged.", file=sys.stderr)
        return 2

    from ray import serve

    from orchestrator.raycompat import driver_started_cluster
    from orchestrator.raycluster import RayAuthError, connect
    from orchestrator.serve.app import router_spec

    import ray

    connected_before = ray.is_initialized()  # a caller's driver (tests, notebooks) owns its cluster
    try:
        connect(ns.address)
    except RayAuthError as e:
        print(f"error: {e}\nNothing was deployed.", file=sys.stderr)
        return 2
    started = not connected_before and driver_started_cluster()
    serve.start(http_options={"host": ns.http_host, "port": ns.http_port})
    try:
        result = deploy(args, app_name=ns.app_name, route_prefix=ns.route_prefix)
    except OrchestratorError as e:
        print(f"error: {e}\nThe running application (if any) is unchanged.", file=sys.stderr)
        return 2
    print(f"deployed {result.app_name}: routing table v{result.table_version}, engines {list(result.engine_deployments)}"
          f" (steps: {', '.join(result.steps)}; added {list(result.added)}, removed {list(result.removed)})")
    spec = router_spec(args, table)
    base_url = f"http://{_url_host(_client_host(ns.http_host))}:{ns.http_port}{ns.route_prefix.rstrip('/')}/v1"
    print(f"OpenAI API at {base_url}" + ("" if _is_loopback(ns.http_host) else
                                         f" (listening on {ns.http_host}: other machines use this host's address)"))
    if not _is_loopback(ns.http_host) and not spec.api_key_sha256:
        print(f"warning: serving on {ns.http_host} without API keys: anyone who can reach port {ns.http_port} can "
              "use the engines; add --api-key-file", file=sys.stderr)
    try:
        urls = direct_ingress_urls(result.app_name)
    except Exception as e:  # the app is deployed; only the listing failed
        logger.warning("could not list the router replicas' direct-ingress URLs: %r", e)
        urls = []
    if urls:
        print(f"router replicas (direct ingress, no proxy hop): {' '.join(urls)}")
    print(first_request_text(base_url, spec.served_model_names[0], api_keys=bool(spec.api_key_sha256)))
    blocking = started if ns.blocking is None else ns.blocking
    if started and not blocking:
        print("note: this command started the local Ray cluster, which stops when it exits: the app is gone. "
              "Start Ray first (`ray start --head`) and deploy with --address 127.0.0.1:6379 to keep it running.")
    if blocking:
        _serve_until_interrupted(started)
    return 0


def first_request_text(base_url: str, model: str, *, api_keys: bool) -> str:
    """The next commands a user runs after deploying: one request with curl and one with the openai
    Python client (``OPENAI_API_KEY`` holds a key when keys are on; the placeholder otherwise)."""
    key_header = " \\\n    -H \"Authorization: Bearer $OPENAI_API_KEY\"" if api_keys else ""
    key_note = ("  (API keys are on: export OPENAI_API_KEY=<one of your keys> first)\n" if api_keys else "")
    api_key = 'os.environ["OPENAI_API_KEY"]' if api_keys else '"not-needed"'
    body = shlex.quote(json.dumps({"model": model, "messages": [{"role": "user", "content": "Say hello."}],
                                   "max_tokens": 32}))
    return (
        "first request:\n" + key_note +
        f"  curl -sS {base_url}/chat/completions -H 'Content-Type: application/json'{key_header} \\\n"
        f"    -d {body}\n"
        "  python - <<'PY'\n"
        "import os\n"
        "from openai import OpenAI\n"
        f"client = OpenAI(base_url={json.dumps(base_url)}, api_key={api_key})\n"
        f"reply = client.chat.completions.create(model={json.dumps(model)}, "
        "messages=[{\"role\": \"user\", \"content\": \"Say hello.\"}], max_tokens=32)\n"
        "print(reply.choices[0].message.content)\n"
        "PY"
    )


def _is_loopback(host: str) -> bool:
    return host in ("localhost", "::1") or host.startswith("127.")


def _client_host(bind_host: str) -> str:
    """Where a client on this machine reaches a proxy bound to ``bind_host``."""
    return {"0.0.0.0": LOOPBACK, "::": "::1", "": LOOPBACK}.get(bind_host, bind_host)


def _serve_until_interrupted(started_cluster: bool) -> None:
    """Keep the driver (and with it a cluster it started) alive until Ctrl-C (SIGINT) or SIGTERM, then
    stop what this command started.

    Both handlers are installed here, SIGINT's too: a command started with ``&`` from a script (a shell
    without job control) inherits SIGINT ignored, as POSIX asks of such shells, and Python then installs
    no KeyboardInterrupt handler at all, so ``kill -INT`` (or a supervisor's Ctrl-C) would leave the
    cluster and the app running."""
    import signal

    import ray
    from ray import serve

    def _stop(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt

    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, _stop)
    print("serving until Ctrl-C" + (" (this command runs the local Ray cluster; Ctrl-C stops it and the app)"
                                    if started_cluster else ""), flush=True)
    try:
        while True:
            # Short sleeps: should a process-directed signal land on one of Ray's threads (Linux offers
            # it to the main thread first), it only sets Python's flag, and the main thread raises
            # KeyboardInterrupt when it next wakes: within a second, not an hour.
            time.sleep(1)
    except KeyboardInterrupt:
        pass
    finally:
        if started_cluster:
            print("stopping the app and the local Ray cluster", flush=True)
            serve.shutdown()
            ray.shutdown()


if __name__ == "__main__":
    sys.exit(main())
