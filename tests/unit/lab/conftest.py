"""lab/ is a package at the repository root, not installed: its tests import it from there."""

import sys
from pathlib import Path

ROOT = str(Path(__file__).resolve().parents[3])
if ROOT not in sys.path:  # `python -m pytest` from the root has it already; plain `pytest` not
    sys.path.insert(0, ROOT)
