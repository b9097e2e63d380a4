"""The terminal display of a benchmark: a rich progress bar (a :class:`BenchProgress`) and the
summary table. Display only: the bench never depends on it."""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

from tuning.bench.counters import accept_length_label

if TYPE_CHECKING:
    from tuning.bench.records import BenchResult, RequestOutput

__all__ = ["RichProgress", "summary_table"]


class RichProgress:
    """A rich progress bar: completed / failed requests, elapsed and remaining time."""

    def __init__(self, description: str = "benchmark", console: Any = None) -> None:
        from rich.console import Console

        self._console = console or Console(stderr=True)
        self._description = description
        self._progress: Any = None
        self._task: Any = None
        self._failed = 0

    def on_start(self, total: int) -> None:
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

        self._progress = Progress(
            TextColumn("[bold]{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("failed: {task.fields[failed]}"),
            TimeElapsedColumn(),
            TimeRemainingColumn(),
            console=self._console,
            transient=False,
        )
        self._progress.start()
        self._task = self._progress.add_task(self._description, total=total, failed=0)

    def on_request_done(self, output: RequestOutput) -> None:
        if self._progress is None:
            return
        if not output.success:
            self._failed += 1
        self._progress.update(self._task, advance=1, failed=self._failed)

    def on_complete(self, result: BenchResult) -> None:
        if self._progress is not None:
            self._progress.stop()
            self._progress = None


def summary_table(result: BenchResult) -> Any:
    from rich.table import Table

    title = "Benchmark result"
    if result.simulated:
        title += f" — SIMULATED ENGINE (time scale {result.time_scale:g}; figures in simulated time)"
    t = Table(title=title, show_header=True)
    t.add_column("metric")
    t.add_column("value", justify="right")
    w = result.workload
    rows: list[tuple[str, str]] = [
        ("workload", f"{w['dataset']} in≤{w['input_len']} out≤{w['output_len']} ratio {w['range_ratio']} x{w['num_prompts']} conc {w['max_concurrency']}"),
        ("completed / failed / cancelled", f"{result.completed} / {result.failed} / {result.cancelled}"),
    ]
    if result.failure_reasons:
        rows.append(("failure reasons", ", ".join(f"{k}: {v}" for k, v in result.failure_reasons.items())))
    rows += [
        ("duration (s)", f"{result.duration_s:.2f}"),
        ("request throughput (req/s)", f"{result.request_throughput:.2f}"),
        ("input throughput (tok/s)", f"{result.input_throughput:.1f}"),
        ("output throughput (tok/s)" + (" [steady state]" if result.early_stopped else ""), f"{result.output_throughput:.1f}"),
        ("total token throughput (tok/s)", f"{result.total_token_throughput:.1f}"),
        ("total input / output tokens", f"{result.total_input_tokens} / {result.total_output_tokens}"),
    ]
    for label, s in (("TTFT", result.ttft_ms), ("TPOT", result.tpot_ms), ("ITL", result.itl_ms), ("E2E", result.e2e_ms)):
        rows.append((f"{label} mean / median / p99 (ms)", f"{s.mean:.2f} / {s.median:.2f} / {s.p99:.2f}"))
    rows.append(("accept length", accept_length_label(result.accept_length, result.spec_counters,
                                                      result.completed + result.cancelled,
                                                      result.tokens_per_step_estimate)))
    if result.steady_state:
        ss = result.steady_state
        rows.append(("steady-state throughput (tok/s)", f"{ss['throughput']:.1f} ± {ss['half_width']:.1f} ({ss['windows']} windows)"))
    rows.append(("engine", f"{result.versions.get('engine')} {result.engine_key or ''}".strip()))
    for k, v in rows:
        t.add_row(k, v)
    return t
