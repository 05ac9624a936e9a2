"""What a bench run prints and writes: a table, one JSON object, per-request JSONL, plots."""

from __future__ import annotations

import json
import math
from dataclasses import asdict
from pathlib import Path

from tropical.bench.plan import PlannedRequest
from tropical.bench.record import Measurement
from tropical.bench.run import BenchRun
from tropical.bench.summary import BenchSummary
from tropical.core.metrics import attains, e2e, tpot, ttft
from tropical.core.request import Request
from tropical.report.tables import render


def summary_dict(run: BenchRun) -> dict[str, object]:
    """The summary's numbers with what was measured: server, model, trace, rate, SLOs."""
    cfg = run.config
    return {"url": cfg.url, "model": run.model.id, "trace": cfg.trace, "rate_scale": cfg.rate_scale,
            "rate_rps": run.rate_rps, "arrival_rate": cfg.rate, "arrival_cv": cfg.arrival_cv,
            "length_scale": cfg.length_scale, **asdict(cfg.bounds),
            "slo_ttft_ms": cfg.slo_ttft_ms, "slo_tpot_ms": cfg.slo_tpot_ms,
            "prompts_capped": sum(p.capped for p in run.planned), **run.summary.as_dict()}


def request_line(planned: PlannedRequest, m: Measurement, req: Request) -> dict[str, object]:
    """One request's timings (seconds since the run started), tokens, error, and the server's
    path headers when it sent them."""
    done = req.error is None
    line: dict[str, object] = {
        "id": m.id, "prompt_tokens": m.prompt_len, "prefix_blocks": list(planned.prefix_blocks),
        "max_tokens": m.max_tokens,
        "capped": planned.capped, "scheduled_s": planned.send_at, "sent_s": m.sent,
        "completion_tokens": m.tokens if done else None, "chunk_times_s": m.chunks,
        "chunk_tokens": m.chunk_tokens if m.counted else None,
        "ttft_s": ttft(req) if done else None, "tpot_s": tpot(req) if done else None,
        "e2e_s": e2e(req) if done else None, "attained": attains(req), "error": m.error,
        "cached_tokens": m.cached_tokens}
    headers = {"path": m.path, "prefill_worker": m.prefill_worker, "reason": m.reason}
    return line | {k: v for k, v in headers.items() if v is not None}


def table(run: BenchRun) -> str:
    s = run.summary
    cfg = run.config
    rows = [[name, *(f"{getattr(dist, p):.3f}" for p in ("p50", "p90", "p99"))]
            for name, dist in (("TTFT (s)", s.core.ttft), ("TPOT (s)", s.core.tpot),
                               ("ITL per token (s)", s.itl), ("chunk gap (s)", s.chunk_gap),
                               ("E2E (s)", s.core.e2e))]
    head = (f"{run.model.id} at {cfg.url}, trace {cfg.trace} ({s.core.requests} requests at "
            f"{cfg.rate_scale:g}x = {run.rate_rps:.2f} req/s, lengths {cfg.length_scale:g}x)")
    tail = (f"SLO attainment {s.core.attainment:.1%} (TTFT <= {cfg.slo_ttft_ms:g} ms and TPOT <= "
            f"{cfg.slo_tpot_ms:g} ms)   goodput {s.goodput_rps:.2f} req/s   completed {s.core.completed}"
            f"   failed {s.core.failed}   throughput {s.core.output_tokens_per_s:.0f} tok/s   "
            f"duration {s.duration_s:.1f} s\n"
            f"stalls (chunk gap > 1 s) in {s.stall_share:.1%} of completed requests   longest chunk gap "
            f"{s.chunk_gap_max_s:.3f} s   tokens per chunk: {_counts_source(s)}\n"
            f"prefix cache: {_hits(s)}")
    failures = [f"failed {n}x: {reason}" for reason, n in sorted(s.failures.items(), key=lambda f: -f[1])]
    return "\n".join([head, render(["metric", "p50", "p90", "p99"], rows), tail, *failures])


def _hits(s: BenchSummary) -> str:
    """The server's prefix-cache hit rate, or that it gave none."""
    if math.isnan(s.prefix_hit_rate):
        return "the server reported no cached_tokens"
    return (f"{s.prefix_hit_rate:.1%} of prompt tokens cached ({s.cached_tokens} tokens, the server's "
            "cached_tokens)")


def _counts_source(s: BenchSummary) -> str:
    """Where the per-token ITL's token counts came from."""
    if not s.token_counts_estimated:
        return "as the server stated them"
    return (f"estimated from usage for {s.token_counts_estimated} of {s.core.completed} requests "
            "(see docs/bench.md)")


def write_outputs(run: BenchRun, out: Path) -> list[Path]:
    """``requests.jsonl``, ``summary.json`` and the PNG plots in ``out``."""
    from tropical.bench.plots import write_plots

    out.mkdir(parents=True, exist_ok=True)
    rows = zip(run.planned, run.measurements, run.requests, strict=True)
    lines = (request_line(p, m, r) for p, m, r in rows)
    jsonl = out / "requests.jsonl"
    jsonl.write_text("".join(json.dumps(line) + "\n" for line in lines))
    summary = out / "summary.json"
    summary.write_text(json.dumps(summary_dict(run), indent=2))
    return [jsonl, summary, *write_plots(run, out)]
