"""What one ``tropical bench`` run does, as a dataclass and its command-line flags."""

from __future__ import annotations

import argparse
from dataclasses import dataclass, fields

from tropical.core.slo import SLO
from tropical.workload.flags import WORKLOAD_HELP
from tropical.workload.transform import LengthBounds

PROMPT_FORMATS = ("ids", "text")
METRICS_HELP = """\
what the numbers are (docs/bench.md has the details):
  TTFT            first streamed chunk (even with empty text) - send
  TPOT            (last chunk carrying tokens - first chunk) / (completion tokens - 1)
  ITL per token   itl_*: each gap between token chunks spread over the chunk's tokens
                  (counts stated by the server in each chunk, else estimated from usage)
  chunk gap       chunk_gap_*: gaps between consecutive token chunks, what a reader waits;
                  stall_share: completed requests with a chunk gap above 1 s
  The chunk with finish_reason counts even with empty text; the usage-only chunk does not.
lengths: --length-scale first, then --min/--max-input/-output, then the server's context."""


@dataclass(frozen=True)
class BenchConfig:
    """A benchmark run. SLO defaults (5 s TTFT, 200 ms TPOT) suit interactive chat on one GPU."""

    url: str
    trace: str = "conversation"
    rate_scale: float = 1.0
    length_scale: float = 1.0
    limit: int | None = None
    arrivals: str = "spread"
    seed: int = 0
    slo_ttft_ms: float = 5000.0
    slo_tpot_ms: float = 200.0
    model: str | None = None
    api_key: str | None = None
    prompt_format: str = "ids"
    timeout: float = 600.0
    out: str | None = None
    rate: float | None = None
    arrival_cv: float = 1.0
    min_input: int | None = None
    max_input: int | None = None
    min_output: int | None = None
    max_output: int | None = None

    def __post_init__(self) -> None:
        for name in ("rate_scale", "length_scale", "slo_ttft_ms", "slo_tpot_ms", "timeout"):
            if not getattr(self, name) > 0:
                raise ValueError(f"--{name.replace('_', '-')} must be positive, got {getattr(self, name)}")
        if self.prompt_format not in PROMPT_FORMATS:
            raise ValueError(f"unknown prompt format {self.prompt_format!r}; choose from "
                             f"{', '.join(PROMPT_FORMATS)}")

    @property
    def bounds(self) -> LengthBounds:
        """Length clamps, applied after ``length_scale``."""
        return LengthBounds(self.min_input, self.max_input, self.min_output, self.max_output)

    @property
    def slo(self) -> SLO:
        """Every request's SLO, in seconds."""
        return SLO(self.slo_ttft_ms / 1e3, self.slo_tpot_ms / 1e3)

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> BenchConfig:
        return cls(**{f.name: getattr(args, f.name) for f in fields(cls)})


def add_bench_options(parser: argparse.ArgumentParser) -> None:
    """The flags of ``tropical bench``; defaults come from BenchConfig."""
    c = BenchConfig
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    parser.epilog = METRICS_HELP
    parser.add_argument("--url", required=True, help="server base URL, e.g. http://127.0.0.1:8000")
    parser.add_argument("--trace", default=c.trace, help="conversation, synthetic, azure-code or a path")
    parser.add_argument("--rate-scale", type=float, default=c.rate_scale,
                        help="multiply the trace's request rate (arrivals divided by it)")
    parser.add_argument("--length-scale", type=float, default=c.length_scale,
                        help="multiply prompt and output lengths (before the length bounds)")
    for name in ("min_input", "max_input", "min_output", "max_output"):
        parser.add_argument(f"--{name.replace('_', '-')}", type=int, default=getattr(c, name),
                            help=WORKLOAD_HELP[name])
    parser.add_argument("--limit", type=int, default=c.limit, help="first N requests of the trace")
    parser.add_argument("--arrivals", default=c.arrivals, help=WORKLOAD_HELP["arrivals"])
    parser.add_argument("--rate", type=float, default=c.rate, help=WORKLOAD_HELP["rate"])
    parser.add_argument("--arrival-cv", type=float, default=c.arrival_cv, help=WORKLOAD_HELP["arrival_cv"])
    parser.add_argument("--seed", type=int, default=c.seed, help="seed of arrivals and prompt tokens")
    parser.add_argument("--slo-ttft-ms", type=float, default=c.slo_ttft_ms)
    parser.add_argument("--slo-tpot-ms", type=float, default=c.slo_tpot_ms)
    parser.add_argument("--model", default=c.model, help="model id (default: the first of /v1/models)")
    parser.add_argument("--api-key", default=c.api_key, help="sent as a Bearer token")
    parser.add_argument("--prompt-format", default=c.prompt_format, choices=PROMPT_FORMATS,
                        help="token ids, or text of about that many tokens")
    parser.add_argument("--timeout", type=float, default=c.timeout, help="seconds per request")
    parser.add_argument("--out", default=c.out, help="directory for requests.jsonl, summary.json, plots")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
