"""The pieces every device harness shares: the carried vLLM launcher and memest's entry point.

The device has no memest install; vLLM's load_general_plugins finds the plugin through a
dist-info folder holding the entry point, put on PYTHONPATH beside the source tree.
"""

from __future__ import annotations

import importlib.util
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
import os  # noqa: E402

# The carried vLLM build: .vllm_h200 (vLLM 0.33.0) unless MEMEST_LAB_CARRY names another folder
# under the repo root (e.g. .vllm_h200_034, built by build_carry.sh OUTDIR 0.34.0).
CARRY = ROOT / os.environ.get("MEMEST_LAB_CARRY", ".vllm_h200")
# Each carry unpacks into, and compiles into, folders of its own: a warm machine that ran one
# vLLM version must not start another from the first one's site or compile cache.
_SUFFIX = CARRY.name.removeprefix(".vllm_h200")
SITE = Path(tempfile.gettempdir()) / f"vllm_h200_site{_SUFFIX}"
CACHE_ROOT = Path(tempfile.gettempdir()) / f"vllm_h200_cache{_SUFFIX}"


def cache_env() -> dict[str, str]:
    """The launcher's cache variables for this carry (it only sets those not already set)."""
    return {
        "VLLM_CACHE_ROOT": str(CACHE_ROOT),
        "TORCHINDUCTOR_CACHE_DIR": str(CACHE_ROOT / "inductor"),
        "TRITON_CACHE_DIR": str(CACHE_ROOT / "triton"),
    }


def launcher() -> Any:
    """The carried shared/vllm-h200 launcher module (site unpacking, env, torchvision)."""
    spec = importlib.util.spec_from_file_location("vllm_h200_try", CARRY / "vllm_h200_try.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def plugin_site() -> Path:
    """A folder with a memest dist-info whose entry point vLLM's load_general_plugins finds."""
    site = Path(tempfile.gettempdir()) / "memest_ep_site"
    info = site / "memest-0.0.0+source.dist-info"
    info.mkdir(parents=True, exist_ok=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: memest\nVersion: 0.0.0+source\n")
    (info / "entry_points.txt").write_text(
        "[vllm.general_plugins]\nmemest = memest_instrumentation.vllm:register\n"
    )
    return site
