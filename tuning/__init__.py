"""Measurement and search: workloads, the benchmark client, the search space, trials, the sweep,
the routing table and reports."""
