"""Running a vLLM pod's pre-flight init container (deploy/kubernetes/vllm/memest-preflight-init.sh)
on this machine, as every manifest in deploy/ configures it, and reading the vLLM command it feeds.

The model's config.json sits in a Hugging Face hub cache laid out as huggingface_hub lays it out
(checked against huggingface_hub's own lookup); the script's `hf download` runs for real with
HF_HUB_OFFLINE=1 (it finds the file in the cache, as it would after a download); `memest` is this
checkout's; vLLM's own FlexibleArgumentParser expands the `--config` file into the arguments
`vllm serve` would parse.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

from tests.conftest import require_or_skip

ROOT = Path(__file__).resolve().parents[1]
INIT_SCRIPT = ROOT / "deploy" / "kubernetes" / "vllm" / "memest-preflight-init.sh"
LLAMA_CONFIG = ROOT / "tests" / "data" / "configs" / "llama8b.json"
COMMIT = "0123456789abcdef0123456789abcdef01234567"
_KUBELET_REF = re.compile(r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)")


def hub_cache(root: Path, model: str, config: Path = LLAMA_CONFIG) -> Path:
    """A hub cache under ``root`` holding ``model``'s config.json at refs/main; returns the file."""
    repo = root / ("models--" + model.replace("/", "--"))
    snapshot = repo / "snapshots" / COMMIT
    snapshot.mkdir(parents=True)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(COMMIT)
    target = snapshot / "config.json"
    shutil.copy(config, target)
    try:
        from huggingface_hub import try_to_load_from_cache
    except ImportError:
        return target
    # The layout is the library's own: its lookup finds the same file.
    assert try_to_load_from_cache(model, "config.json", cache_dir=str(root)) == str(target)
    return target


def container_env(container: dict[str, Any], flags: dict[str, str]) -> dict[str, str]:
    """The plain ``value`` variables of a container, after those of its ConfigMap ``flags``."""
    env = dict(flags)
    for item in container.get("env", []):
        if "value" in item:
            env[item["name"]] = kubelet_expand(str(item["value"]), env)
    return env


def kubelet_expand(text: str, env: dict[str, str]) -> str:
    """$(NAME) replaced as the kubelet does: by a variable defined before, else left as it is."""
    return _KUBELET_REF.sub(lambda m: env.get(m.group(1), m.group(0)), text)


def relocate(value: str, mounts: dict[str, Path]) -> str:
    """A path under a container's mount point moved to the local folder standing in for it."""
    for mount, local in sorted(mounts.items(), key=lambda kv: -len(kv[0])):
        if value == mount or value.startswith(mount + "/"):
            return str(local) + value[len(mount) :]
    return value


def run_init(
    command: list[str], env: dict[str, str], mounts: dict[str, Path], home: Path
) -> subprocess.CompletedProcess[str]:
    """Run the init container's command (memest-preflight-init is the repository's script) with
    its variables, mount paths moved to local folders, offline, HOME in ``home``."""
    assert command == ["memest-preflight-init"], command
    local = {k: relocate(v, mounts) for k, v in env.items()}
    # This environment's `memest`, `hf` and `python3` first; no credentials, no network.
    bin_dir = str(Path(sys.executable).parent)
    local.update(PATH=f"{bin_dir}{os.pathsep}{os.environ['PATH']}", HF_HUB_OFFLINE="1")
    local.pop("HF_TOKEN", None)
    local["HOME"] = str(home)
    local["PYTHONPATH"] = os.environ.get("PYTHONPATH", "")
    return subprocess.run(
        ["sh", str(INIT_SCRIPT)], env=local, capture_output=True, text=True, timeout=180
    )


def vllm_config_args(argv: list[str], mounts: dict[str, Path]) -> list[str]:
    """``vllm serve`` arguments with the ``--config`` file expanded by vLLM's own parser."""
    try:
        from vllm.utils.argparse_utils import FlexibleArgumentParser
    except Exception as exc:
        require_or_skip("MEMEST_REQUIRE_VLLM", f"vLLM's argument parser is not importable: {exc}")
    args = [relocate(a, mounts) for a in argv]
    return list(FlexibleArgumentParser()._pull_args_from_config(args))


def flag(argv: list[str], name: str) -> str | None:
    """The value after the last ``name`` in ``argv`` (argparse keeps the last), or None."""
    values = [argv[i + 1] for i, a in enumerate(argv[:-1]) if a == name]
    return values[-1] if values else None


def preflight_kv_bytes(env: dict[str, str]) -> int:
    """The KV size `memest preflight` prints for the pod's flags, asked directly of the config."""
    cmd = [sys.executable, "-m", "memest", "preflight", "--model-config", str(LLAMA_CONFIG)]
    cmd += ["--gpu", env.get("GPU_KIND", "h200")]
    for var, option in (
        ("TENSOR_PARALLEL_SIZE", "--tensor-parallel-size"),
        ("MAX_NUM_SEQS", "--max-num-seqs"),
        ("MAX_NUM_BATCHED_TOKENS", "--max-num-batched-tokens"),
        ("MAX_MODEL_LEN", "--max-model-len"),
        ("GPU_MEMORY_UTILIZATION", "--gpu-memory-utilization"),
    ):
        if env.get(var):
            cmd += [option, env[var]]
    done = subprocess.run(cmd + ["--json"], capture_output=True, text=True, check=True, timeout=120)
    kv: int = json.loads(done.stdout)["kv_cache_bytes"]
    return kv


def write_measured_plan(cache_root: Path) -> Path:
    """A startup plan where the plugin writes one (VLLM_CACHE_ROOT/startup_plan), by memest's
    own writer, as a start with MEMEST_ESTIMATE=plan leaves it."""
    from memest.estimate import startup_plan_dir, startup_plan_document, write_startup_plan

    doc = startup_plan_document("00112233aabbccdd", 100 * 2**30, 130 * 2**30)
    return write_startup_plan(startup_plan_dir(cache_root), doc)
