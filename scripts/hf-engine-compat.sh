#!/usr/bin/env bash
# Run the HF engine's checks (scripts/hf_engine_check.py) on another transformers than the project venv's:
# by default the oldest that pyproject.toml allows, in a venv made once and kept for later runs.
#
#   scripts/hf-engine-compat.sh            # the oldest allowed transformers
#   scripts/hf-engine-compat.sh 5.22.2     # a given one (e.g. the newest vLLM 0.34 allows)
#
# Environment: PYTHON (default python3), TORCH_SPEC (default torch==2.13.0, the CPU build the Makefile installs),
# ECHO2_COMPAT_DIR (where the venvs live, default ~/.cache/echo2/hf-compat).
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-python3}"
TORCH_SPEC="${TORCH_SPEC:-torch==2.13.0}"
version="${1:-$("$PYTHON" - <<'PY'
import re, tomllib
deps = tomllib.load(open("pyproject.toml", "rb"))["project"]["dependencies"]
pin = next(d for d in deps if re.match(r"transformers\b", d))
print(re.search(r">=\s*([0-9][0-9.]*)", pin).group(1))
PY
)}"
venv="${ECHO2_COMPAT_DIR:-$HOME/.cache/echo2/hf-compat}/transformers-$version"
mkdir -p "$(dirname "$venv")"
exec 9>"$venv.lock"
flock 9  # two runs at once (a CI checkout beside a working copy) must not build the same venv over each other
if [ ! -x "$venv/bin/python" ] || ! "$venv/bin/python" -c "import sys, transformers; from packaging.version import \
        Version; sys.exit(Version(transformers.__version__) != Version('$version'))" 2>/dev/null; then
    echo "making $venv (${TORCH_SPEC}, transformers==$version)"
    rm -rf "$venv"
    "$PYTHON" -m venv "$venv"
    "$venv/bin/python" -m pip install -q "$TORCH_SPEC" "transformers==$version"
fi
# The base install's other dependencies (what the engine's imports reach: pydantic, orjson, ...), on every run: a venv
# made before one was added gets it (a no-op when all are there).
mapfile -t deps < <("$PYTHON" - <<'PY'
import re, tomllib
for dep in tomllib.load(open("pyproject.toml", "rb"))["project"]["dependencies"]:
    if not re.match(r"(torch|transformers)\b", dep):
        print(dep)
PY
)
"$venv/bin/python" -m pip install -q "${deps[@]}"
PYTHONPATH="$PWD" "$venv/bin/python" scripts/hf_engine_check.py
