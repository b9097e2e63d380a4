"""Whether a routing table pays on a mixed workload, apart from serving it: each traffic class's share of a
drive's goodput, the table against the best single config (and against the cap) round by round with
confidence intervals, the cap's selection from each part driven alone, the GPUs the apps reserve, a table
moved to another memory fraction, and the markdown report.

Why in the package: ``benchmarks/mixed_payoff.py`` serves and drives the apps, and these pure parts are what
its tests and ``benchmarks/gpu/measure_reproducibility.py`` share; a test imports them from here, never from
a benchmark script.
"""
from __future__ import annotations

import json
from typing import Any

__all__ = ["class_goodputs", "gpus_reserved", "measure_cap", "render_markdown", "summarize", "table_routes",
           "with_memory_fraction"]


def with_memory_fraction(table_data: dict[str, Any], fraction: float) -> dict[str, Any]:
    """``table_data`` with every config (buckets and cells) at memory fraction ``fraction``,
    and its planned replicas re-keyed to the configs' new engine keys."""
    from orchestrator.config import EngineConfig

    if not 0 < fraction < 1:
        raise SystemExit(f"error: --memory-fraction {fraction} must lie between 0 and 1")
    out = json.loads(json.dumps(table_data))
    renamed: dict[str, str] = {}

    def moved(cfg: dict[str, Any]) -> dict[str, Any]:
        new = {**cfg, "memory_fraction": fraction}
        renamed[EngineConfig.from_dict(cfg).key()] = EngineConfig.from_dict(new).key()
        return new

    for b in out["buckets"]:
        b["config"] = moved(b["config"])
        for part in b.get("cells", ()):
            part["config"] = moved(part["config"])
    budget = out.get("provenance", {}).get("gpu_budget")
    if budget and budget.get("replicas"):
        merged: dict[str, int] = {}
        for k, n in budget["replicas"].items():
            merged[renamed.get(k, k)] = merged.get(renamed.get(k, k), 0) + n
        budget["replicas"] = merged
    return out


def gpus_reserved(apps: dict[str, tuple[dict[str, Any], dict[str, int]]], share_gpu: bool, cap_engines: int = 0) -> float:
    """GPUs the apps' engines reserve together (``apps``: name -> (table, replicas per engine key)), plus
    ``cap_engines`` more of the largest reservation (the cap app, deployed later)."""
    from orchestrator import table as routing

    total, largest = 0.0, 0.0
    for data, replicas in apps.values():
        configs = routing.parse(data).distinct_configs()
        for key, n in replicas.items():
            r = configs[key].gpu_request(share_gpu=share_gpu)
            total += n * r
            largest = max(largest, r)
    return round(total + cap_engines * largest, 4)


def class_goodputs(records: Any, profile: Any, slo: Any, classes: int) -> list[float]:
    """Each class's share of the drive's goodput (good tokens of its requests per second of the profile):
    they sum to the drive's overall goodput."""
    from tuning.drive import overall_figures

    return [overall_figures([r for r in records if r.class_index == c], profile, slo).goodput for c in range(classes)]


def summarize(drives: list[dict[str, Any]], apps: list[str], cap_app: str | None = None) -> dict[str, Any]:
    """Per mix: per app the overall and per-phase goodput per round (faithful drives only), mean and 95 %
    CI; per round the ratio table / best single (the single with the best mean), and its CI; with
    ``cap_app`` (the app that serves the cap: ``cap`` or a single) also table / cap."""
    from tuning.stats import mean_confidence_interval

    def ci(xs: list[float]) -> dict[str, Any] | None:
        if not xs:
            return None
        m, lo, hi = mean_confidence_interval(xs)
        return {"mean": round(m, 4), "ci95": [round(lo, 4), round(hi, 4)], "n": len(xs), "values": [round(x, 4) for x in xs]}

    out: dict[str, Any] = {}
    for mix in sorted({d["mix"] for d in drives}):
        ds = [d for d in drives if d["mix"] == mix]
        good = [d for d in ds if d["kept_schedule"]]
        per_app: dict[str, Any] = {}
        for app in apps:
            mine = [d for d in good if d["app"] == app]
            if not mine:
                continue
            phases = [p["label"] for p in mine[0]["phases"]]
            per_app[app] = {
                "goodput": ci([d["overall"]["goodput"] for d in mine]),
                "throughput": ci([d["overall"]["throughput"] for d in mine]),
                "phases": {lab: {"goodput": ci([d["phases"][i]["goodput"] for d in mine]),
                                 "throughput": ci([d["phases"][i]["throughput"] for d in mine])}
                           for i, lab in enumerate(phases)}}
        singles = {a: v for a, v in per_app.items() if a.startswith("single-")}
        entry: dict[str, Any] = {"apps": per_app, "drives": len(ds), "faithful_drives": len(good),
                                 "unfaithful": [f"{d['app']} round {d['round']}" for d in ds if not d["kept_schedule"]]}
        references: dict[str, str] = {}  # what the tables are held against: name in the report -> app
        if singles:
            entry["best_single"] = references["best single"] = max(singles, key=lambda a: singles[a]["goodput"]["mean"])
        if cap_app and cap_app in per_app and mix == "stated":  # the cap was chosen for the stated mix
            entry["cap"] = references["cap"] = cap_app
        for name, ref in references.items():
            for t in (a for a in per_app if a.startswith("table")):
                ratios, phase_ratios = _paired_ratios(ds, t, ref)
                entry[f"ratio {t} / {name}"] = ci(ratios)
                entry[f"phase ratios {t} / {name}"] = {k: ci(v) for k, v in phase_ratios.items()}
        out[mix] = entry
    return out


def _paired_ratios(drives: list[dict[str, Any]], app: str, ref: str) -> tuple[list[float], dict[str, list[float]]]:
    """``app``'s goodput over ``ref``'s, overall and per phase, in every round where both drives kept their
    schedule (a pair with an unfaithful drive ranks nothing)."""
    ratios: list[float] = []
    phase_ratios: dict[str, list[float]] = {}
    for rnd in sorted({d["round"] for d in drives}):
        here = {d["app"]: d for d in drives if d["round"] == rnd}
        if app not in here or ref not in here or not (here[app]["kept_schedule"] and here[ref]["kept_schedule"]):
            continue
        ratios.append(here[app]["overall"]["goodput"] / max(here[ref]["overall"]["goodput"], 1e-9))
        for i, p in enumerate(here[app]["phases"]):
            phase_ratios.setdefault(p["label"], []).append(p["goodput"] / max(here[ref]["phases"][i]["goodput"], 1e-9))
    return ratios, phase_ratios


def table_routes(table: Any, part: tuple[str, str]) -> set[str]:
    """The engine keys ``table`` sends the (bucket, band) ``part`` to, over every load its cells name."""
    b = table.bucket(part[0])
    levels = {1, *(c.min_in_flight for c in b.cells)}
    return {(cell.engine_config() if (cell := b.cell_for(part[1], n)) else b.engine_config()).key() for n in levels}


def measure_cap(table_data: dict[str, Any], mix: Any, singles: dict[str, str], replicas: int,
                part_goodput: Any, configs: dict[str, dict[str, Any]],
                table_replicas: dict[str, int] | None = None) -> dict[str, Any]:
    """The cap's selection: every single app (``singles``: app -> engine key, each on ``replicas``
    engines) serves each part (bucket x sampling band) of ``mix`` alone, ``part_goodput(app, part_mix,
    label)`` -> goodput or ``None`` (engines fell behind); :func:`tuning.choose.cap.best_routing` routes the parts
    on ``replicas`` replicas. Returns the record: per part its token share, every single's goodput per
    replica and the route; the routing's replicas and predicted rate; and ``app``: ``"cap"`` (with
    ``table``, to deploy), the single app that is the cap, ``"table"`` when the best routing is the
    table's own (its routes at every load, on ``table_replicas``), or ``error`` when a part has no rate."""
    from orchestrator import table as routing
    from tuning.choose.cap import best_routing, cap_table, pooled_rate
    from tuning.traffic import TrafficMix

    table = routing.parse(table_data)
    shares = mix.cell_shares(table, by="tokens")
    rates: dict[tuple[str, str, str], float] = {}
    for bucket, band in sorted(shares):
        part_mix = TrafficMix(default_temperature=mix.default_temperature, classes=[
            c for c in mix.classes if table.bucket_for(c.max_tokens).name == bucket
            and table.band_for(mix.temperature_of(c)).name == band])
        for app, key in singles.items():
            good = part_goodput(app, part_mix, f"{bucket}/{band}")
            if good is not None:
                rates[(key, bucket, band)] = good / replicas
    record: dict[str, Any] = {"configs": sorted(set(singles.values())), "parts": [
        {"bucket": b, "band": band, "token_share": round(s, 4), "route": None,
         "rates": {k: round(rates[(k, b, band)], 3) for k in sorted(set(singles.values())) if (k, b, band) in rates}}
        for (b, band), s in sorted(shares.items())]}
    try:
        plan = best_routing(rates, shares, replicas)
    except ValueError as e:
        return {**record, "error": str(e)}
    for part in record["parts"]:
        part["route"] = plan.routes[(part["bucket"], part["band"])]
    record.update(replicas=dict(plan.replicas), predicted_rate=round(plan.rate, 3),
                  predicted_pooled_rate=round(pooled_rate(rates, shares, replicas), 3))
    if table_replicas is not None and dict(plan.replicas) == dict(table_replicas) and all(
            table_routes(table, part) == {route} for part, route in plan.routes.items()):
        return {**record, "app": "table",
                "note": "the best routing is the table's own, on its replicas: the table is the cap"}
    if plan.single:
        return {**record, "app": f"single-{plan.single}",
                "note": f"on {replicas} replica(s) the best routing sends every part to {plan.single} (a split "
                        f"leaves some config too few replicas): the cap is that single config's app"}
    routed = cap_table(table_data, plan, configs, rates, primary_band=table.sampling_bands[0].name)
    return {**record, "app": "cap", "table": routed,
            "note": f"{len(plan.replicas)} configs, the parts routed to their fastest on whole replicas"}


def _fmt(ci: dict[str, Any] | None, digits: int = 0) -> str:
    if not ci:
        return "-"
    lo, hi = ci["ci95"]
    return f"{ci['mean']:,.{digits}f} ({lo:,.{digits}f}-{hi:,.{digits}f})"


def render_markdown(result: dict[str, Any]) -> str:
    """The results' tables (goodput per phase and overall, ratios) as Markdown, from the JSON record."""
    lines = []
    slo = result["slo"]
    for mix, entry in result["summary"].items():
        apps = entry["apps"]
        if not apps:
            lines += [f"### Mix `{mix}`: no faithful drive", ""]
            continue
        phases = list(next(iter(apps.values()))["phases"])
        label = "SIMULATED" if result.get("simulated", True) else "measured"
        lines += [f"### Mix `{mix}` — goodput, output tok/s ({label}), mean (95 % CI) over faithful rounds", "",
                  "| app | " + " | ".join(phases) + " | overall goodput | overall throughput | rounds |",
                  "|---" * (len(phases) + 4) + "|"]
        for app, v in apps.items():
            lines.append(f"| {app} | " + " | ".join(_fmt(v["phases"][ph]["goodput"]) for ph in phases)
                         + f" | **{_fmt(v['goodput'])}** | {_fmt(v['throughput'])} | {v['goodput']['n']} |")
        lines.append("")
        for k, v in entry.items():
            if k.startswith("ratio") and v:
                ref = entry["cap"] if k.endswith("/ cap") else entry["best_single"]
                lines.append(f"- **{k}** ({ref}): **{_fmt(v, 3)}**, per round {v['values']}")
            if k.startswith("phase ratios"):
                lines.append(f"- {k}: " + "; ".join(f"{ph} {_fmt(c, 3)}" for ph, c in v.items() if c))
        lines.append(f"- drives: {entry['drives']}, faithful: {entry['faithful_drives']}"
                     + (f"; left out (engines fell behind): {', '.join(entry['unfaithful'])}" if entry["unfaithful"] else ""))
        lines.append("")
    lines.append(f"Good request: completed, TTFT <= {slo['ttft_s']:g} s and TPOT <= {slo['tpot_s'] * 1000:g} ms"
                 + (" (simulated time)." if result.get("simulated", True) else "."))
    warm, plan = result.get("warm_up"), result.get("warm_up_plan") or {}
    if warm:
        lines += ["", (f"Warm-up, before anything was measured (one unmeasured {plan.get('seconds', 0):g}-s drive of the "
                       f"stated mix per app at {plan.get('in_flight', '?')} in flight): "
                       + ", ".join(f"{w['app']} {w['goodput']:,.0f} tok/s" for w in warm))]
    elif not result.get("simulated", True):
        lines += ["", "No warm-up: each app's first drive (the cap's selection for the singles, round 0 for the table) "
                      "ran on fresh engines" + (" (the run ended before its warm-up)." if plan.get("on") else ".")]
    cap = result.get("cap")
    if cap:
        lines += ["", (f"### The cap: each part of the stated mix alone on each single app ({cap['seconds']:g}-s steady "
                       f"drive at {cap['in_flight']} in flight), goodput per replica, tok/s"), "",
                  "| part | token share | " + " | ".join(cap["configs"]) + " | cap routes it to |",
                  "|---" * (len(cap["configs"]) + 3) + "|"]
        for part in cap["parts"]:
            rates = [part["rates"].get(k) for k in cap["configs"]]
            lines.append(f"| {part['bucket']}/{part['band']} | {part['token_share']:.3f} | "
                         + " | ".join("-" if r is None else f"{r:,.0f}" for r in rates) + f" | {part['route']} |")
        lines += ["", (f"- cap: {cap.get('note', '')}; replicas {cap['replicas']}, predicted {cap['predicted_rate']:,.0f} "
                       f"tok/s of goodput on the mix; served by app `{cap['app']}`") if cap.get("app") else
                  f"- cap not served: {cap.get('error')}"]
        if cap.get("predicted_pooled_rate"):
            lines.append(f"- every part on its fastest config with the engines' time split at will (a bound also for a "
                         f"router that spills; predicted from these rates, not served): {cap['predicted_pooled_rate']:,.0f} tok/s")
    return "\n".join(lines)
