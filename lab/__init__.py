"""The lab's tooling, not the product: device harnesses and the scripts that turn their output
into reports/ (ARCHITECTURE.md lists them).

A package: lab modules import each other as ``lab.X`` and tests import them as ``from lab import
X``. Each script runs either as ``python -m lab.X`` or as ``python3 lab/X.py`` from the
repository root with nothing installed (the device harnesses are started that way), so a script
that imports memest or another lab module first puts the repository root on ``sys.path``.
"""
