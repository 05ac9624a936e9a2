#!/usr/bin/env bash
# The toggle's win checked live (issue 15): the fidelity study in the setting where the simulator
# predicts tropical+ >= 1.3x the best baseline. (The default `tropical fidelity` is the accuracy
# study, at shorter prompts; docs/fidelity.md gives both.)
#
# Usage: bash benchmarks/live_win.sh [extra tropical fidelity flags]   (~1 hour; not run in CI)
# The setting is the one benchmarks/live_win_search.py found in the simulator (docs/fidelity.md,
# "The toggle's win, chosen in the simulator"): 150 Mooncake conversation requests at 0.3x rate,
# lengths x0.05, SLOs TTFT 3 s / TPOT 300 ms, 2 SmolLM2 workers of 1 torch thread, every policy
# 3 times, in this host's time units (--host-check match: the rate over the host check's ratio
# to the profile, the SLOs times it), so that every host serves the load the search priced.
# Results: $OUT/fidelity.md (the tables), $OUT/fidelity.json (median_abs_error and
# path_agreement at the top), $OUT/<policy>/<repeat>/ (bench outputs), $OUT/logs/.
# Knobs (environment): TROPICAL, PROFILE, REPEATS, OUT. Flags given on the command line come last
# and win, e.g. a smoke run: bash benchmarks/live_win.sh --model tiny-random --profile P --limit 12
# Run it on a quiet machine: other jobs on the 2 cores slow the workers and the spread widens.
set -euo pipefail
cd "$(dirname "$0")/.."

TROPICAL=${TROPICAL:-.venv/bin/tropical}
PROFILE=${PROFILE:-docs/fidelity/profile.json}   # tropical profile --model smollm2 --grid medium, 1 thread
REPEATS=${REPEATS:-3}
OUT=${OUT:-docs/fidelity/win}

exec "$TROPICAL" fidelity --model smollm2 --profile "$PROFILE" --threads 1 \
  --policies colocated,chunked,disagg,tropical,tropical+ --trace conversation --limit 150 \
  --rate-scale 0.3 --length-scale 0.05 --max-model-len 2048 --slo-ttft-ms 3000 --slo-tpot-ms 300 \
  --kv-tokens 16384 --max-batched-tokens 2048 --host-check match --repeats "$REPEATS" --out "$OUT" "$@"
