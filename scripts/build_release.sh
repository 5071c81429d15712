#!/usr/bin/env bash
# Build the release of vllm-memest: the sdist and, from it, the wheel, into dist/ (or the folder
# given). `python -m build` with its defaults, each in an isolated environment with the build
# requirements pyproject.toml names; the release workflow runs this same command.
#   bash scripts/build_release.sh            # dist/vllm_memest-VERSION.tar.gz and -py3-none-any.whl
#   pip install 'dist/vllm_memest-VERSION-py3-none-any.whl[vllm]'
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${1:-dist}
PY=${PYTHON:-python3}
[ -x .venv/bin/python ] && [ -z "${PYTHON:-}" ] && PY=.venv/bin/python
if ! "$PY" -c 'import build' 2>/dev/null; then
  echo "build_release: $PY has no 'build' module; install it: $PY -m pip install build" >&2
  exit 2
fi
rm -rf "$OUT"
"$PY" -m build --outdir "$OUT" .
ls -1 "$OUT"
