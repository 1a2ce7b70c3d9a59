#!/usr/bin/env bash
# The vLLM engine's first GPU run, as one command (a few minutes on one GPU):
#
#   scripts/gpu-smoke.sh               # pip install '.[vllm]', pip check, then scripts/gpu_smoke.py
#   scripts/gpu-smoke.sh --no-install  # vLLM is installed already (an offline machine)
#   scripts/gpu-smoke.sh --skip-bf16   # any other argument goes to scripts/gpu_smoke.py
#
# Prints PASS/FAIL lines and "N passed, M failed"; exits 0 with SKIP where there is no CUDA GPU. PYTHON picks
# the interpreter (default python3; use the venv the agent runs from).
set -uo pipefail
cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-python3}"
install=1
args=()
for arg in "$@"; do
    if [ "$arg" = "--no-install" ]; then install=0; else args+=("$arg"); fi
done

if ! "$PYTHON" -c 'import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)' 2>/dev/null \
        && ! command -v nvidia-smi >/dev/null; then
    echo "SKIP no CUDA GPU: nothing to check here"
    exit 0
fi
if [ "$install" = 1 ]; then
    echo "-- pip install -e '.[vllm]'"
    "$PYTHON" -m pip install -q -e '.[vllm]' || { echo "FAIL pip install -e '.[vllm]'"; exit 1; }
fi
if "$PYTHON" -m pip check; then echo "PASS pip check"; else echo "FAIL pip check (the smoke goes on)"; fi
"$PYTHON" - <<'PY'
import importlib.metadata as md
for name in ("echo2", "vllm", "torch", "transformers", "tokenizers", "safetensors", "flashinfer-python"):
    try:
        print(f"{name} {md.version(name)}")
    except md.PackageNotFoundError:
        print(f"{name} (not installed)")
PY
PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" exec "$PYTHON" scripts/gpu_smoke.py "${args[@]}"
