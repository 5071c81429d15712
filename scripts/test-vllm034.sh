#!/usr/bin/env bash
# The vLLM plugin and oracle tests (pytest marker "vllm") against vLLM 0.34.0's real classes.
# Builds .venv-vllm034 once, layered over .venv (scripts/test.sh's, which holds vLLM 0.33.0):
# the new venv adds .venv's site-packages after its own, so vLLM 0.34.0 (installed --no-deps)
# shadows 0.33.0 while torch and every dependency both releases share are reused, not installed
# again (about two minutes on 2 cores, the wheel's download and unpacking most of it). Extra
# pytest arguments are passed through.
set -euo pipefail
cd "$(dirname "$0")/.."
VERSION=0.34.0
VENV=.venv-vllm034
# flashinfer-python==0.7.3 (vLLM 0.34.0's pin) is not on the package registry; .venv's
# flashinfer stands in for it (the CPU tests never run its kernels).
SKIP=(--skip flashinfer-python)
if [ ! -x "$VENV/bin/python" ] || ! "$VENV/bin/python" -c "import importlib.metadata as m, sys; sys.exit(m.version('vllm') != '$VERSION')" 2>/dev/null; then
  rm -rf "$VENV"
  .venv/bin/python -m venv "$VENV"
  base=$(.venv/bin/python -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")
  own=$("$VENV/bin/python" -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")
  # addsitedir also runs .venv's own .pth files (memest's editable install among them).
  echo "import site; site.addsitedir('$base')" > "$own/zz_memest_base_venv.pth"
  "$VENV/bin/python" -m pip install -q --no-deps "vllm==$VERSION"
  "$VENV/bin/python" scripts/vllm_requirements.py "${SKIP[@]}" > "$VENV/vllm-requirements.txt"
  "$VENV/bin/python" -m pip install -q -r "$VENV/vllm-requirements.txt"
fi
"$VENV/bin/python" -c "import importlib.metadata as m; print('vLLM', m.version('vllm'), 'in $VENV')"
# The plugin against 0.34's real classes, memest's figures against 0.34's own code. The lab's
# and the pre-flight's model-class checks are of vLLM 0.33.0's code (the main run has them).
"$VENV/bin/python" -m pytest -m vllm -p no:cacheprovider \
  tests/unit/instrumentation_vllm tests/unit/test_vllm_versions.py \
  tests/unit/estimate/test_startup_plan.py tests/integration/test_vllm_plugin.py \
  tests/integration/test_vllm_oracle.py "$@"
