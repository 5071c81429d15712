"""Golden output of ``memest estimate --snapshot`` on call 12's MLA start: the what-if replayed
through the start's allocator history. The history is a 1.6 MB gzip, over tests/data's 1 MiB a
file, so this case reads it from reports/vllm/raw (test_golden_whatif_cli.py holds the rest).
It detects a change of the printed output, not the truth of a figure (tests/golden.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from memest.cli import main
from tests.golden import check

ROOT = Path(__file__).resolve().parents[2]
NAME = "call12.L_dsv2lite8l_s64_t2048.apply-hist"
ARGV = [
    "estimate",
    "--from",
    f"tests/data/starts/{NAME}.report.rank0.json",
    "--grid",
    json.dumps({"max_num_seqs": 128}),
    "--snapshot",
    f"reports/vllm/raw/{NAME}.snapshot.rank0.json.gz",
]


@pytest.mark.parametrize("suffix", ["txt", "json"])
def test_mla_replay_output_is_unchanged(
    suffix: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(ROOT)  # the arguments name committed files relative to the root
    code = main(ARGV if suffix == "txt" else [*ARGV, "--json"])
    out = capsys.readouterr()
    assert (code, out.err) == (0, "")
    check(f"estimate/mla-replay.{suffix}", out.out)
