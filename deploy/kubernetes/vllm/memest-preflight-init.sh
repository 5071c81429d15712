#!/bin/sh
# The pre-flight init container of a vLLM pod (installed in the vllm-memest image as
# /usr/local/bin/memest-preflight-init; every manifest in deploy/ runs it). It writes the vLLM
# config file that vLLM's command reads with `--config`:
#   - the first start of a model and flags: `kv-cache-memory-bytes` from `memest preflight`,
#     sized from the model's own config.json (a model folder, or the Hugging Face cache, where
#     `hf download MODEL config.json` puts it first; HF_TOKEN, HF_HUB_OFFLINE apply);
#   - once a start with the same model and flags has written its measured startup plan (the
#     plugin, MEMEST_ESTIMATE=plan) under VLLM_CACHE_ROOT/startup_plan on the persistent volume:
#     no KV size, so that vLLM (VLLM_ENABLE_STARTUP_PLAN=1) applies the measured plan; vLLM
#     applies none when --kv-cache-memory-bytes is given.
# Environment: MODEL (what `vllm serve` takes), MODEL_REVISION, GPU_KIND (h200), TENSOR_PARALLEL_SIZE,
# MAX_NUM_SEQS, MAX_NUM_BATCHED_TOKENS, MAX_MODEL_LEN, GPU_MEMORY_UTILIZATION (the same values
# vLLM is started with), VLLM_CACHE_ROOT and MEMEST_VLLM_CONFIG (required: the file written, on a
# volume vLLM's container mounts too), MEMEST_PREFLIGHT_ARGS (more `memest preflight` flags).
set -eu
: "${MODEL:?set MODEL: the Hugging Face id or model folder vLLM serves}"
: "${VLLM_CACHE_ROOT:?set VLLM_CACHE_ROOT: vLLM's cache folder on the persistent volume}"
: "${MEMEST_VLLM_CONFIG:?set MEMEST_VLLM_CONFIG: the file vLLM reads with --config}"
out=$MEMEST_VLLM_CONFIG
plans=$VLLM_CACHE_ROOT/startup_plan
util=${GPU_MEMORY_UTILIZATION:-0.9}

set -- --model "$MODEL" --gpu "${GPU_KIND:-h200}" \
  --tensor-parallel-size "${TENSOR_PARALLEL_SIZE:-1}" --gpu-memory-utilization "$util"
[ -z "${MODEL_REVISION:-}" ] || set -- "$@" --revision "$MODEL_REVISION"
[ -z "${MAX_NUM_SEQS:-}" ] || set -- "$@" --max-num-seqs "$MAX_NUM_SEQS"
[ -z "${MAX_NUM_BATCHED_TOKENS:-}" ] || set -- "$@" --max-num-batched-tokens "$MAX_NUM_BATCHED_TOKENS"
[ -z "${MAX_MODEL_LEN:-}" ] || set -- "$@" --max-model-len "$MAX_MODEL_LEN"
# shellcheck disable=SC2086 # word splitting of the extra flags is wanted
[ -z "${MEMEST_PREFLIGHT_ARGS:-}" ] || set -- "$@" ${MEMEST_PREFLIGHT_ARGS}

mkdir -p "$plans" "$(dirname "$out")"
# One marker per model and flags: written when the pre-flight sizes a start, so a plan newer than
# it was measured by a start with these flags.
key=$(printf '%s\n' "$@" | sha256sum | cut -c1-16)
marker=$plans/memest-preflight-$key
if [ -f "$marker" ] && [ -n "$(find "$plans" -maxdepth 1 -name 'startup_plan_*.json' -newer "$marker")" ]; then
  printf 'gpu-memory-utilization: %s\n' "$util" >"$out"
  echo "memest preflight: a start with these flags measured its startup plan; vLLM applies it"
  exit 0
fi
if [ ! -d "$MODEL" ]; then
  hf download "$MODEL" config.json ${MODEL_REVISION:+--revision "$MODEL_REVISION"} >/dev/null
fi
memest preflight "$@" --json >"$marker.json"
kv=$(python3 -c 'import json, sys; print(json.load(open(sys.argv[1]))["kv_cache_bytes"])' "$marker.json")
printf 'gpu-memory-utilization: %s\nkv-cache-memory-bytes: %s\n' "$util" "$kv" >"$out"
touch "$marker"
echo "memest preflight: --kv-cache-memory-bytes $kv"
