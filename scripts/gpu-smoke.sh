#!/usr/bin/env bash
# The GPU path's first run, as one command (a few minutes on one GPU):
#
#   scripts/gpu-smoke.sh               # pip install '.[vllm]', pip check, then scripts/gpu_smoke_torch.py (the HF
#                                      # engine, the learner in bf16, FSDP2 on NCCL, snapshot installs) and
#                                      # scripts/gpu_smoke.py (the vLLM engine)
#   scripts/gpu-smoke.sh --no-install  # what is installed is what runs (an offline machine; no vLLM: its checks SKIP)
#   scripts/gpu-smoke.sh --skip-bf16   # any other argument goes to scripts/gpu_smoke.py
#
# Prints PASS/FAIL/SKIP lines and "N passed, M failed" per script; exits 0 with SKIP where there is no CUDA GPU,
# 1 when a check failed. PYTHON picks the interpreter (default python3; use the venv the agent runs from). With
# OUT set, gpu_smoke_torch.py keeps its output in $OUT/gpu-smoke.log too.
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
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
status=0
"$PYTHON" scripts/gpu_smoke_torch.py || status=1
"$PYTHON" scripts/gpu_smoke.py "${args[@]}" || status=1
exit "$status"
