"""Serving a routing table with Ray Serve: engine replicas, the routing ingress, policy and metrics.

Import :mod:`orchestrator.serve.app` (``build_app``, ``app_builder``) to build the application and
:mod:`orchestrator.deploy` to deploy it; :mod:`orchestrator.serve.policy` and
:mod:`orchestrator.serve.protocol` are pure and importable without Ray.
"""
from __future__ import annotations

from orchestrator.serve.policy import NoHealthyDeploymentError, RouteDecision, choose_route
from orchestrator.serve.protocol import ApiError, ParsedRequest, parse_request

__all__ = [
    "ApiError",
    "NoHealthyDeploymentError",
    "ParsedRequest",
    "RouteDecision",
    "choose_route",
    "parse_request",
]
