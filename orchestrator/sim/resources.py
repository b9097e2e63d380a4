"""What a simulated engine's Serve replica reserves on a Ray node.

A Ray CPU reservation is admission control, not a cap: it decides whether the app fits the cluster.
Reserving a whole CPU per simulated engine (as for LMDeploy, whose host process keeps a core busy)
refused the default sweep's four-engine table on the 2-core machine that had just produced it. The
fraction below comes from a measurement, not a guess: docs/analyses/sim_engine_cpu_2026-12-06.md.
"""
from __future__ import annotations

ENGINE_CPUS = 0.25
"""CPUs one simulated engine replica reserves (the replica actor and its ``orchestrator.sim`` process).

At the default sweep's load (concurrency 64, time scale 20) the loaded engine used 0.31 CPU and each
idle one 0.02, while the whole app (router, proxy, engines) used 1.35 CPU: the router's 1 CPU plus
0.25 per engine reserves 2.0 for the default sweep's at most four engines, half again that load (the
loaded engine alone is above its share: the margin is in the sum), and fits the 2-core machine that
ran the sweep."""
