"""Decide a sweep's routing table again from its measured results, with this build's rules (the choice
is a pure function of the results: :func:`tuning.choose.table.choose_table`). For a sweep whose run dir
did not come back whole from a GPU lease: the results file, the committed table (for its provenance)
and the sweep's own arguments are enough; nothing is measured.

    python benchmarks/gpu/rechoose_table.py --results DIR/results.parquet --table DIR/routing_table.json \\
        --out DIR/routing_table_rechosen.json -- --model /root/ckpt --buckets 256,1024 ...   # the sweep's flags

Prints the table chosen (each bucket's primary and cells), the notes, and the mix prediction.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    sweep_argv = argv[argv.index("--") + 1:] if "--" in argv else []
    own = argv[:argv.index("--")] if "--" in argv else argv
    p = argparse.ArgumentParser(prog="rechoose_table.py", description=__doc__.split("\n\n")[0])
    p.add_argument("--results", required=True, help="the sweep's results.parquet")
    p.add_argument("--table", required=True, help="the table the sweep committed (its provenance is kept)")
    p.add_argument("--out", required=True, help="where to write the table chosen again")
    p.add_argument("--gpus", type=int, default=1, help="GPUs of the cluster the sweep ran on (default 1)")
    a = p.parse_args(own)
    if not sweep_argv:
        p.error("give the sweep's own flags after --")

    import pandas as pd

    from orchestrator import table as routing
    from tuning.choose.table import choose_table
    from tuning.sweep.cli import parser, traffic_from_args
    from tuning.sweep.spec import build_spec, load_defaults
    from tuning.sweep.summary import traffic_line

    args = parser().parse_args(sweep_argv)
    spec = build_spec(args, load_defaults(), cluster_gpus=a.gpus, cluster_cpus=16)
    results = pd.read_parquet(a.results)
    committed = routing.load(a.table)
    traffic = traffic_from_args(args)
    table = choose_table(results, spec, committed.provenance, traffic)
    out = Path(a.out)
    out.write_text(table.to_json())
    for b in table.buckets:
        print(f"{b.name}: {b.engine_config().label()} ({b.figures.output_throughput:,.0f} tok/s)"
              + "".join(f"; {c.sampling}@{c.min_in_flight}+ -> {c.engine_config().label()}"
                        f" ({c.figures.output_throughput:,.0f} vs {c.primary_figures.output_throughput:,.0f})"
                        for c in b.cells if c.primary_figures))
    for n in table.provenance.notes:
        print(f"  - {n}")
    if traffic is not None:
        print(traffic_line(table, results, spec, traffic))
    print(f"wrote {out} (committed table: {json.dumps([b.engine_config().label() for b in committed.buckets])})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
