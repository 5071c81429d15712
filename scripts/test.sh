#!/usr/bin/env bash
# Install memest with every extra into .venv, then run ruff, mypy (strict) and the test suite,
# then the vLLM tests again against vLLM 0.34.0 (scripts/test-vllm034.sh). .venv keeps vLLM
# 0.33.0, the oldest supported release. Extra pytest arguments are passed to the main run:
# bash scripts/test.sh -k plan
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$PY" -m venv .venv
.venv/bin/python -m pip install -q --upgrade pip
.venv/bin/python -m pip install -q -e '.[dev,service,postgres,vllm,plots]' 'vllm==0.33.0'
if [ -x scripts/setup-test-extras.sh ]; then bash scripts/setup-test-extras.sh; fi
.venv/bin/ruff check .
.venv/bin/ruff format --check .
.venv/bin/mypy
.venv/bin/python -m pytest "$@"
bash scripts/test-vllm034.sh -q
