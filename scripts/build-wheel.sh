#!/usr/bin/env bash
# Build the project's wheels for the site to serve at /dist/ (frontend/dist.py): echo2-<version>-py3-none-any.whl
# (the agent, with torch) and echo2_cli-<version>-py3-none-any.whl (the owner's CLI alone, no torch). Providers
# `pip install` the agent from the site, with no public index. `make install` and docker/Dockerfile.site
# run this; run it again after changing the code to serve the change (the site picks it up without a restart).
#
#   scripts/build-wheel.sh [OUTDIR]     # default var/dist (the site's default ECHO2_DIST_DIR)
#
# Environment: PYTHON (default python3). Its own setuptools builds the wheel when it is new enough (>= 77, no
# network); otherwise pip builds in an isolated environment, fetching setuptools from the package index.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-python3}"
out="${1:-var/dist}"
isolation=()  # pip's default: an isolated build environment with pyproject.toml's build requirements
if "$PYTHON" -c "import sys, setuptools; sys.exit(int(setuptools.__version__.split('.')[0]) < 77)" 2>/dev/null; then
    isolation=(--no-build-isolation)
fi
# setuptools reuses build/lib: a module deleted since an earlier build would ride along in the wheel.
rm -rf build
mkdir -p "$out"
staging="$(mktemp -d)"
trap 'rm -rf "$staging"' EXIT
"$PYTHON" -m pip wheel -q --no-deps ${isolation[@]+"${isolation[@]}"} . -w "$staging"
wheel="$(ls "$staging"/echo2-*.whl)"
# The directory holds the one wheel just built: an older one left beside it would be served as well.
rm -f "$out"/echo2-*.whl
mv "$wheel" "$out/"
rm -rf build
echo "built $out/$(basename "$wheel")"

# The owner's CLI alone (packaging/echo2-cli/pyproject.toml): built from a staging copy of that pyproject with the
# checkout's echo2_cli/ and dataplane/ beside it (setuptools takes no sources from above a project's folder).
cli_src="$staging/echo2-cli"
mkdir -p "$cli_src"
cp packaging/echo2-cli/pyproject.toml "$cli_src/"
tar -c --exclude=__pycache__ --exclude='*.pyc' echo2_cli dataplane | tar -x -C "$cli_src"
"$PYTHON" -m pip wheel -q --no-deps ${isolation[@]+"${isolation[@]}"} "$cli_src" -w "$staging"
cli_wheel="$(ls "$staging"/echo2_cli-*.whl)"
rm -f "$out"/echo2_cli-*.whl
mv "$cli_wheel" "$out/"
echo "built $out/$(basename "$cli_wheel")"
