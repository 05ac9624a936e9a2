"""What the workload flags mean, said once for ``sim``/``sweep``/``reproduce`` and ``bench``."""

from __future__ import annotations

WORKLOAD_HELP: dict[str, str] = {
    "arrivals": "without --rate: trace (recorded timestamps), spread (requests sharing a rounded "
                "timestamp spread within its tick) or poisson (at the trace's mean rate)",
    "rate": "requests per second: arrivals as a renewal process at this rate instead of the trace's "
            "timestamps (needed by a length-only trace); Poisson unless --arrival-cv says otherwise",
    "arrival_cv": "coefficient of variation of the gaps between --rate arrivals (gamma-distributed): "
                  "1 is Poisson, above 1 bursty",
    "min_input": "raise shorter prompts to this many tokens (applied after any length scaling)",
    "max_input": "cut longer prompts to this many tokens (applied after any length scaling)",
    "min_output": "raise shorter outputs to this many tokens (applied after any length scaling)",
    "max_output": "cut longer outputs to this many tokens (applied after any length scaling)",
}
