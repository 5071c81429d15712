"""Screenshots of the dashboard for the README (docs/screenshots/), from a running demo service.

    memest serve --demo --port 8765 &
    python scripts/dashboard_screenshots.py http://127.0.0.1:8765 docs/screenshots

Headless Chromium through playwright (MEMEST_CHROMIUM, default /usr/bin/chromium); each shot is
the top of the page at 1,400 px wide, the part an operator reads first, kept under 300 KB.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from playwright.sync_api import sync_playwright

#: File name -> (page path, height of the shot in CSS pixels).
SHOTS = {
    "index.png": ("/", 700),
    "run-llama8b.png": ("/models/llama8b", 1100),
    "compare-deepseek-main-pr.png": (
        "/compare?a=demo-deepseek-v4-flash-dspark-k7-main&b=demo-deepseek-v4-flash-dspark-k7-pr",
        1100,
    ),
    "history-llama8b.png": ("/history/llama8b", 1000),
}
LIMIT_BYTES = 300 * 1024


def main(base: str, out: Path) -> int:
    out.mkdir(parents=True, exist_ok=True)
    exe = os.environ.get("MEMEST_CHROMIUM", "/usr/bin/chromium")
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=exe, headless=True, args=["--no-sandbox"])
        for name, (path, height) in SHOTS.items():
            page = browser.new_page(viewport={"width": 1400, "height": height})
            page.goto(base.rstrip("/") + path)
            page.wait_for_load_state("networkidle")
            page.screenshot(path=str(out / name))
            page.close()
            size = (out / name).stat().st_size
            print(f"{out / name}: {size:,} bytes")
            if size > LIMIT_BYTES:
                print(f"{name} is over {LIMIT_BYTES:,} bytes", file=sys.stderr)
                return 1
        browser.close()
    return 0


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit("usage: python scripts/dashboard_screenshots.py BASE_URL OUT_DIR")
    sys.exit(main(sys.argv[1], Path(sys.argv[2])))
