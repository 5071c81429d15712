"""memest report / check / push / serve, driven through memest.cli.main."""

from __future__ import annotations

import http.server
import json
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from memest.cli import main
from memest.cli.push import push_one
from memest.demo import demo_report
from tests.integration.service.conftest import TOKEN


@pytest.fixture
def demo_files(tmp_path: Path) -> dict[str, Path]:
    out = {}
    for slug, short in (("deepseek-v4-flash-dspark-k7", "ds"), ("minimax-m3-eagle3-k3", "mm")):
        for build in ("main", "PR"):
            p = tmp_path / f"{short}-{build.lower()}.json"
            p.write_text(demo_report(slug, build).model_dump_json(indent=1))
            out[f"{short}-{build.lower()}"] = p
    return out


def test_report_run_and_comparison(demo_files: dict[str, Path], tmp_path: Path) -> None:
    out = tmp_path / "out"
    assert main(["report", str(demo_files["ds-pr"]), "--out", str(out), "--html"]) == 0
    md = (out / "memest-report-ds-pr.md").read_text()
    assert "| target.full | 48 | 512 requests x q=8" in md or "512 requests x q=8" in md
    assert "10.525" in md and "8.016" in md
    svg = (out / "memest-report-ds-pr.svg").read_text()
    assert svg.startswith("<svg") and 'data-owner="indexer_logits_fp32"' in svg
    assert "<svg" in (out / "memest-report-ds-pr.html").read_text()
    assert (
        main(["report", str(demo_files["mm-main"]), str(demo_files["mm-pr"]), "--out", str(out)])
        == 0
    )
    cmp = (out / "memest-compare-mm-main-vs-mm-pr.md").read_text()
    # The seed's MiniMax table: total graph pool 1.799 -> 6.127, graphs 411 -> 270, KV 0.94x.
    assert "| Total graph pool |  | 1.799 | 6.127 |" in cmp
    assert "| Total graphs | 411 | 270 |" in cmp
    assert "0.94×" in cmp


def test_report_never_overwrites_without_force(
    demo_files: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    args = ["report", str(demo_files["ds-pr"]), "--out", str(tmp_path)]
    assert main(args) == 0
    assert main(args) == 2
    assert "exists" in capsys.readouterr().err
    assert main([*args, "--force"]) == 0


def test_report_png(demo_files: dict[str, Path], tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    assert main(["report", str(demo_files["ds-main"]), "--out", str(tmp_path), "--png"]) == 0
    assert (tmp_path / "memest-report-ds-main.png").read_bytes()[:4] == b"\x89PNG"


def test_check_exit_codes(demo_files: dict[str, Path], capsys: pytest.CaptureFixture[str]) -> None:
    pr = str(demo_files["ds-pr"])
    # DeepSeek PR: 17.051 GiB graph pool, vLLM's estimate off by -3.81 GiB.
    assert main(["check", pr, "--max-graph-pool", "6GiB", "--max-estimate-error", "0.25GiB"]) == 1
    out = capsys.readouterr().out
    assert "FAIL  graph pool" in out and "FAIL  estimate error (vllm)" in out
    assert main(["check", pr, "--max-graph-pool", "18GiB", "--max-estimate-error", "4GiB"]) == 0
    assert main(["check", pr, "--max-stage", "target.full=10GiB"]) == 1
    # Against main: KV 7,660,426 -> 6,208,214 tokens (-19.0%), graph pool 4.33 -> 17.05 GiB
    # (+294%): past the default 5% pool threshold unless a wider one is given.
    base = ["check", pr, "--baseline", str(demo_files["ds-main"])]
    assert main([*base, "--max-kv-drop", "0.20", "--max-pool-growth", "3"]) == 0
    assert main([*base, "--max-kv-drop", "0.10", "--max-pool-growth", "3"]) == 1
    assert main([*base, "--max-kv-drop", "0.20"]) == 1
    assert "FAIL  Graph-pool growth vs baseline: +294.2%" in capsys.readouterr().out
    # A figure the report lacks is an error, not a pass.
    assert main(["check", pr, "--max-estimate-error", "1GiB", "--estimator", "memest"]) == 2
    assert "no usage-minus-budget figure" in capsys.readouterr().err
    assert main(["check", pr, "--max-graph-pool", "lots"]) == 2
    assert main(["check", pr]) == 2


def test_check_names_a_bad_report(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"run_id": "x", "model": "m"}))
    assert main(["check", str(bad), "--max-graph-pool", "1GiB"]) == 2
    err = capsys.readouterr().err
    assert "config" in err and err.count("\n") == 1


def test_push_to_a_live_server(
    demo_files: dict[str, Path], live_server: str, capsys: pytest.CaptureFixture[str]
) -> None:
    files = [str(p) for p in demo_files.values()]
    assert main(["push", *files, "--url", live_server, "--token", TOKEN]) == 0
    assert capsys.readouterr().out.count(": created") == 4
    assert main(["push", files[0], "--url", live_server, "--token", TOKEN]) == 0
    assert ": exists" in capsys.readouterr().out
    assert main(["push", files[0], "--url", live_server, "--token", "wrong", "--retries", "3"]) == 1
    out = capsys.readouterr().out
    assert "HTTP 401" in out and "after 1 attempt" in out


class _Flaky(http.server.BaseHTTPRequestHandler):
    calls = 0

    def do_POST(self) -> None:  # noqa: N802
        type(self).calls += 1
        self.rfile.read(int(self.headers["Content-Length"]))
        code, body = (
            (503, b'{"detail":"busy"}')
            if type(self).calls <= 2
            else (201, b'{"status":"created","report_id":"r-1","run_id":"run-1"}')
        )
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def flaky_url() -> Iterator[str]:
    _Flaky.calls = 0
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Flaky)
    t = threading.Thread(target=server.serve_forever, daemon=True)
    t.start()
    yield f"http://127.0.0.1:{server.server_address[1]}/api/v1/reports"
    server.shutdown()


def test_push_retries_transient_errors(flaky_url: str) -> None:
    waits: list[float] = []
    r = push_one(
        b"{}",
        flaky_url,
        TOKEN,
        report_id="r-1",
        retries=3,
        timeout_s=5,
        backoff_s=0.1,
        sleep=waits.append,
    )
    assert r.ok and r.attempts == 3 and waits == [0.1, 0.2] and r.message == "created"


def test_push_gives_up_after_retries(flaky_url: str) -> None:
    waits: list[float] = []
    r = push_one(
        b"{}",
        flaky_url,
        None,
        report_id="r-1",
        retries=1,
        timeout_s=5,
        backoff_s=0.1,
        sleep=waits.append,
    )
    assert not r.ok and r.attempts == 2 and "HTTP 503" in r.message


def test_serve_exit_after_load(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    url = f"sqlite:///{tmp_path / 'demo.db'}"
    assert main(["serve", "--demo", "--exit-after-load", "--database-url", url]) == 0
    out = capsys.readouterr().out
    assert "deepseek-ai/DeepSeek-V4-Flash-DSpark: 2 runs (main, PR)" in out
    assert "llama8b: 4 runs (vllm-0.33.0+memest-0.1.0)" in out  # the real H200 starts
    assert "5 models stored" in out
