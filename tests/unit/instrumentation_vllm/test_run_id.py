"""Run ids: one per launch, shared by its ranks; never repeated by a re-run of the same setup."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from memest_instrumentation.vllm.env import derive_run_id, process_start_ticks

REPO = Path(__file__).resolve().parents[3]

# A launcher that starts two "ranks" as its children, as vLLM's engine core starts its workers.
LAUNCHER = """
import subprocess, sys
rank = "from memest_instrumentation.vllm.env import derive_run_id; print(derive_run_id())"
ids = [subprocess.run([sys.executable, "-c", rank], capture_output=True, text=True, check=True)
       .stdout.strip() for _ in range(2)]
print(" ".join(ids))
"""


def _launch(env: dict[str, str]) -> list[str]:
    out = subprocess.run(
        [sys.executable, "-c", LAUNCHER], capture_output=True, text=True, check=True, env=env
    )
    return out.stdout.split()


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="needs Linux /proc")
def test_two_launches_with_the_same_env_differ_and_ranks_agree() -> None:
    env = {k: v for k, v in os.environ.items() if k != "MEMEST_RUN_ID"}
    env["PYTHONPATH"] = f"{REPO}{os.pathsep}{REPO / 'instrumentation'}"
    env.update(MASTER_ADDR="127.0.0.1", MASTER_PORT="29500")  # the same rendezvous both times
    first, second = _launch(env), _launch(env)
    assert len(first) == 2 and first[0] == first[1]
    assert len(second) == 2 and second[0] == second[1]
    assert first[0] != second[0]


def _fake_proc(root: Path, pid: int, start_ticks: int, boot_id: str) -> str:
    (root / str(pid)).mkdir(parents=True, exist_ok=True)
    # Field 2 may hold spaces and parentheses; start time is field 22.
    fields = ["S", *[str(n) for n in range(4, 22)], str(start_ticks), "0", "0"]
    (root / str(pid) / "stat").write_text(f"{pid} (python3 (a) b) " + " ".join(fields) + "\n")
    kernel = root / "sys" / "kernel" / "random"
    kernel.mkdir(parents=True, exist_ok=True)
    (kernel / "boot_id").write_text(boot_id + "\n")
    return str(root)


def test_start_time_is_read_past_a_command_name_with_parentheses(tmp_path: Path) -> None:
    root = _fake_proc(tmp_path, 1, 987654, "boot-a")
    assert process_start_ticks(1, root) == "987654"
    assert process_start_ticks(2, root) == ""  # no such process: empty, never raises


def test_a_restarted_container_with_the_same_pids_gets_a_new_id(tmp_path: Path) -> None:
    env = {"VLLM_PORT": "8000"}
    before = derive_run_id(env, parent_pid=1, proc_root=_fake_proc(tmp_path / "a", 1, 100, "b1"))
    later = derive_run_id(env, parent_pid=1, proc_root=_fake_proc(tmp_path / "b", 1, 900, "b1"))
    rebooted = derive_run_id(env, parent_pid=1, proc_root=_fake_proc(tmp_path / "c", 1, 100, "b2"))
    same = derive_run_id(env, parent_pid=1, proc_root=_fake_proc(tmp_path / "d", 1, 100, "b1"))
    assert len({before, later, rebooted}) == 3
    assert same == before


def test_explicit_run_id_wins(tmp_path: Path) -> None:
    assert derive_run_id({"MEMEST_RUN_ID": " nightly-42 "}, parent_pid=1) == "nightly-42"
