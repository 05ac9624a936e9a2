#!/usr/bin/env bash
# The paper's comparison over vLLM, repeated: the same two vLLM instances (CPU build, SmolLM2) behind
# tropical serve --engine vllm with each policy, replaying the same trace slice at several rates,
# several times each, and every run beside its twin's prediction (benchmarks/vllm_policies_twin.py).
#   vllm-chunked: vLLM's own chunked prefill on both instances, fewest-unfinished-tokens routing
#   disagg:       1 prefill + 1 decode instance, KV handed off through NIXL (DistServe's split)
#   tropical, tropical+: 1 prefill + 1 multiplexing instance, the toggle deciding on sched.Cluster's
#                 mirrors of the instances
# Both instances are started once with the NIXL connector in role kv_both, so every policy routes
# the very same processes; each run gets its own router. Not run in CI (vLLM, ~1 minute per run).
#
# Usage: bash benchmarks/vllm_policies.sh
# Knobs (environment): LIMIT, LENGTH_SCALE, RATE_SCALES, REPEATS, SLO_TTFT_MS, SLO_TPOT_MS, POLICIES,
# OUT, GRID, NIXL_POLL_DELAY_US (the opt-in NIXL poll delay of docs/vllm.md, on here; 0 turns it off).
# Results: $OUT/<policy>/rate-<scale>/run-<k>/ (tropical bench's output), $OUT/twin.json and a
# Markdown table on stdout: each policy's goodput, mean (min..max) over the repeats, beside its twin's.
set -euo pipefail
cd "$(dirname "$0")/.."

VENV=.venv-vllm
OUT=${OUT:-out/vllm_policies}
NAME=smollm2
DTYPE=float32
MAX_MODEL_LEN=2048
LIMIT=${LIMIT:-24}
LENGTH_SCALE=${LENGTH_SCALE:-0.05}
RATE_SCALES=${RATE_SCALES:-"0.1 0.15 0.2"}
REPEATS=${REPEATS:-3}
SLO_TTFT_MS=${SLO_TTFT_MS:-3000}
SLO_TPOT_MS=${SLO_TPOT_MS:-300}
POLICIES=${POLICIES:-"vllm-chunked disagg tropical tropical+"}
GRID=${GRID:-quick}
NIXL_POLL_DELAY_US=${NIXL_POLL_DELAY_US:-1000}
START_TIMEOUT_S=1500
PORTS=(8331 8332)
SIDE_PORTS=(5611 5612)
ROUTER_PORT=8330
pids=()

log() { echo "[vllm_policies] $*" >&2; }

stop_all() {  # every process started here runs in its own session: stop each whole group
    for pid in "${pids[@]}"; do kill -TERM -- "-$pid" 2>/dev/null || true; done
    sleep 5
    for pid in "${pids[@]}"; do kill -KILL -- "-$pid" 2>/dev/null || true; done
    pids=()
}
trap stop_all EXIT
trap 'exit 130' INT TERM

wait_up() {  # wait_up URL PID LOGFILE
    local deadline=$((SECONDS + START_TIMEOUT_S))
    until curl -sf "$1" >/dev/null 2>&1; do
        if ! kill -0 "$2" 2>/dev/null || ((SECONDS > deadline)); then
            log "$1 did not come up; the end of $3:"; tail -n 30 "$3" >&2; exit 1
        fi
        sleep 2
    done
}

start_instance() {  # start_instance INDEX: vLLM on its own core, NIXL connector as both roles;
    # cpu_patch keeps the model's thread on that core (vLLM's NIXL worker moves it to the last core)
    local i=$1 logfile=$OUT/vllm-$1.log
    PYTHONPATH=src/tropical/serve/vllm/cpu_patch TROPICAL_NIXL_POLL_DELAY_US=$NIXL_POLL_DELAY_US \
        VLLM_HOST_IP=127.0.0.1 VLLM_CPU_KVCACHE_SPACE=1 VLLM_CPU_OMP_THREADS_BIND=$i VLLM_CPU_NUM_OF_RESERVED_CPU=0 \
        VLLM_NIXL_SIDE_CHANNEL_HOST=127.0.0.1 VLLM_NIXL_SIDE_CHANNEL_PORT=${SIDE_PORTS[$i]} \
        setsid "$VENV/bin/python" -m vllm.entrypoints.openai.api_server --model "$OUT/$NAME" \
        --served-model-name "$NAME" --dtype "$DTYPE" --max-model-len "$MAX_MODEL_LEN" \
        --host 127.0.0.1 --port "${PORTS[$i]}" \
        --kv-transfer-config '{"kv_connector":"NixlConnector","kv_role":"kv_both","kv_buffer_device":"cpu"}' \
        >"$logfile" 2>&1 &
    pids+=($!)
    instance_pids[$i]=$!
}

worker_urls() {  # worker_urls POLICY: the roles this policy gives the two instances
    local a=http://127.0.0.1:${PORTS[0]} b=http://127.0.0.1:${PORTS[1]}
    case $1 in
        vllm-chunked) echo "colocated=$a,colocated=$b" ;;
        disagg) echo "prefill=$a,decode=$b" ;;
        tropical | tropical+) echo "prefill=$a,multiplex=$b" ;;
        *) log "unknown policy '$1'"; exit 2 ;;
    esac
}

run_policy() {  # run_policy POLICY RATE_SCALE REPEAT: a router over the instances, the trace slice, stop
    local policy=${1#vllm-} dir=$OUT/$1/rate-$2/run-$3 url=http://127.0.0.1:$ROUTER_PORT
    local logfile=$dir/router.log  # each run's own: the router's online speed estimates per instance
    rm -rf "$dir" && mkdir -p "$dir"
    setsid .venv/bin/tropical serve --engine vllm --policy "$policy" --worker-urls "$(worker_urls "$1")" \
        --model "$OUT/$NAME" --served-model-name "$NAME" --max-model-len "$MAX_MODEL_LEN" \
        --profile "$OUT/profile.json" --slo-ttft-ms "$SLO_TTFT_MS" --slo-tpot-ms "$SLO_TPOT_MS" \
        --port "$ROUTER_PORT" >"$logfile" 2>&1 &
    local router=$!
    wait_up "$url/health" "$router" "$logfile"
    log "$1, rate x$2, run $3: replaying $LIMIT requests (length x$LENGTH_SCALE)"
    .venv/bin/tropical bench --url "$url" --model "$NAME" --trace conversation --limit "$LIMIT" \
        --length-scale "$LENGTH_SCALE" --rate-scale "$2" \
        --slo-ttft-ms "$SLO_TTFT_MS" --slo-tpot-ms "$SLO_TPOT_MS" --out "$dir" --json >/dev/null
    curl -s "$url/metrics" >"$dir/router-metrics.txt"
    kill -TERM -- "-$router" 2>/dev/null || true
    wait "$router" 2>/dev/null || true
}

bash scripts/setup-vllm.sh
mkdir -p "$OUT"
[[ -f $OUT/$NAME/config.json ]] || .venv/bin/tropical export --model smollm2 --dtype "$DTYPE" --out "$OUT/$NAME" >&2
declare -a instance_pids
if curl -sf "http://127.0.0.1:${PORTS[0]}/v1/models" >/dev/null && curl -sf "http://127.0.0.1:${PORTS[1]}/v1/models" >/dev/null; then
    log "reusing the instances already up on ports ${PORTS[*]} (left by an interrupted run; stop them yourself)"
else
    for i in 0 1; do start_instance "$i"; done
    for i in 0 1; do wait_up "http://127.0.0.1:${PORTS[$i]}/v1/models" "${instance_pids[$i]}" "$OUT/vllm-$i.log"; done
    log "both instances are up"
fi
[[ -f $OUT/profile.json ]] || .venv/bin/tropical profile --server "http://127.0.0.1:${PORTS[0]}" \
    --model "$OUT/$NAME" --grid "$GRID" --out "$OUT/profile.json" >&2
for repeat in $(seq 1 "$REPEATS"); do  # repeats outermost: a slow spell of the machine hits every policy
    for rate in $RATE_SCALES; do
        for policy in $POLICIES; do run_policy "$policy" "$rate" "$repeat"; done
    done
done
log "measuring instance 0 again, as it ran (the twin's iteration times)"
.venv/bin/tropical profile --server "http://127.0.0.1:${PORTS[0]}" --model "$OUT/$NAME" --grid "$GRID" \
    --out "$OUT/profile-truth.json" >&2
SLO_TTFT_MS=$SLO_TTFT_MS SLO_TPOT_MS=$SLO_TPOT_MS .venv/bin/python benchmarks/vllm_policies_twin.py "$OUT"
