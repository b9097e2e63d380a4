"""The private Ray names :mod:`orchestrator.raycompat` relies on still exist, take the parameters it
passes and do what it relies on. A Ray upgrade that changes one of them fails here, not in a deployed
router. (No cluster: each check builds the real Ray object locally.)"""
from __future__ import annotations

import inspect

import pytest

pytest.importorskip("ray")

from ray import serve  # noqa: E402

from orchestrator import raycompat  # noqa: E402


def _params(fn) -> dict[str, inspect.Parameter]:
    return dict(inspect.signature(fn).parameters)


def test_handle_options_still_takes_by_reference_and_the_serializers():
    from ray.serve.handle import DeploymentHandle

    params = _params(DeploymentHandle.options)
    for name in ("stream", "_by_reference", "request_serialization", "response_serialization"):
        assert name in params and params[name].kind is inspect.Parameter.KEYWORD_ONLY, name


@pytest.mark.parametrize("by_reference", [False, True])
def test_the_handle_options_record_the_transport(by_reference):
    """What ``handle.options(...)`` stores on the new handle (calling it needs a running Serve; the
    served path is tests/integration/test_serve_app.py, which deploys with the gRPC transport)."""
    from ray.serve.handle import DeploymentHandle

    opts = DeploymentHandle("engine", "app").handle_options.copy_and_update(
        stream=True, _by_reference=by_reference, request_serialization="pickle", response_serialization="pickle")
    assert (opts.stream, opts._by_reference) == (True, by_reference)
    assert (opts.request_serialization, opts.response_serialization) == ("pickle", "pickle")


def test_stream_handle_passes_the_transport_as_handle_options_keywords():
    calls = []

    class Handle:  # records the keywords DeploymentHandle.options is called with
        def options(self, **kwargs):
            calls.append(kwargs)
            return self

    raycompat.stream_handle(Handle(), by_reference=False, request_serialization="pickle")
    assert calls == [{"stream": True, "_by_reference": False, "request_serialization": "pickle"}]


def test_deployment_options_still_takes_version_through_internal_only():
    from ray.serve.deployment import Deployment

    params = _params(Deployment.options)
    assert "version" in params and "_internal" in params

    @serve.deployment
    class Engine:
        pass

    with pytest.raises(ValueError, match="version"):  # the public path refuses it: why raycompat exists
        Engine.options(version="v1")
    assert raycompat.with_deployment_version(Engine, "v1").version == "v1"
    assert Engine.version != "v1"  # a copy, as Deployment.options returns


def test_serve_context_still_has_get_global_client_with_the_flag_we_pass():
    from ray.serve import context

    params = _params(context._get_global_client)
    assert "raise_if_no_controller_running" in params
    assert params["raise_if_no_controller_running"].default is True  # we pass False: None instead of raising


def test_ray_still_enables_token_auth_through_the_function_we_call():
    from ray._private.authentication import authentication_token_setup as setup

    assert _params(setup._enable_token_auth) == {}
    assert setup.AUTH_MODE_ENV_VAR == "RAY_AUTH_MODE"
    # what it does (read from its source: calling it would switch this test process to token mode)
    source = inspect.getsource(setup._enable_token_auth)
    assert "AUTH_MODE_ENV_VAR" in source and "Config.initialize" in source


def test_a_driver_node_still_says_whether_it_is_the_head_it_started():
    from ray._private import node, worker

    assert {"head", "connect_only"} <= set(_params(node.Node.__init__))
    assert "self.head = head" in inspect.getsource(node.Node.__init__)
    assert hasattr(worker, "_global_node")
    assert raycompat.driver_started_cluster() is False  # not connected: nothing started
    # (True after a local ray.init: tests/integration/test_deploy_cli.py's local deploy stays up because of it)


def test_no_other_module_calls_a_private_ray_name():
    """raycompat is the one place: no other module passes ``_by_reference=`` / ``_internal=``, imports
    from ``ray._private`` or ``_get_global_client`` (read from the code's syntax tree, so docstrings may
    name them)."""
    import ast
    import pathlib

    private_keywords = {"_by_reference", "_internal"}
    private_names = {"_get_global_client", "_global_node", "_enable_token_auth"}
    root = pathlib.Path(raycompat.__file__).parents[1]
    offenders = []
    for path in [p for d in ("orchestrator", "tuning") for p in (root / d).rglob("*.py")]:
        if path.name == "raycompat.py":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            used = ({k.arg for k in node.keywords} & private_keywords if isinstance(node, ast.Call) else set()) | (
                {"ray._private"} if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("ray._private")
                else set()) | (
                {a.name for a in node.names} & private_names if isinstance(node, ast.ImportFrom) else set()) | (
                {node.attr} & private_names if isinstance(node, ast.Attribute) else set())
            offenders += [f"{path.relative_to(root)}:{node.lineno}: {name}" for name in used]
    assert offenders == []
