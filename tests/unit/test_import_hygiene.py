"""Imports flow one way (ARCHITECTURE.md's import-arrows table), and the core stays light.

The table in ARCHITECTURE.md is the rule: each row names a package and what it may import. This
file parses it, checks it has no cycle (so an arrow back up cannot be added to the table either),
then checks every import statement of every module under memest/ and instrumentation/ against it.
"""

from __future__ import annotations

import ast
import json
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
ARCHITECTURE = ROOT / "ARCHITECTURE.md"
INSTRUMENTATION = ROOT / "instrumentation"
WILDCARD = "memest.*"


def arrows(text: str | None = None) -> dict[str, set[str]]:
    """ARCHITECTURE.md's table: package → the packages it may import (``memest.*``: any)."""
    text = ARCHITECTURE.read_text() if text is None else text
    block = re.search(r"<!-- import-arrows: begin -->(.*?)<!-- import-arrows: end -->", text, re.S)
    assert block, "ARCHITECTURE.md has no import-arrows table"
    table: dict[str, set[str]] = {}
    for line in block.group(1).splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) != 2 or not cells[0].startswith("`"):
            continue
        package = re.findall(r"`([^`]+)`", cells[0])[0]
        table[package] = set(re.findall(r"`([^`]+)`", cells[1]))
    return table


def cycle(table: dict[str, set[str]]) -> list[str] | None:
    """One cycle among the table's arrows (wildcards left out), or None."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done

    def visit(node: str, path: list[str]) -> list[str] | None:
        state[node] = 1
        for target in sorted(table.get(node, set()) - {WILDCARD}):
            if state.get(target) == 1:
                return [*path[path.index(target) :], target] if target in path else [node, target]
            if state.get(target) is None:
                found = visit(target, [*path, target])
                if found:
                    return found
        state[node] = 2
        return None

    for start in sorted(table):
        if state.get(start) is None:
            found = visit(start, [start])
            if found:
                return found
    return None


def package_of(module: str, table: dict[str, set[str]]) -> str | None:
    """The table row a dotted module name falls under (longest matching prefix)."""
    parts = module.split(".")
    for n in range(len(parts), 0, -1):
        name = ".".join(parts[:n])
        if name in table:
            return name
    return None


def module_name(path: Path) -> str:
    base = INSTRUMENTATION if path.is_relative_to(INSTRUMENTATION) else ROOT
    parts = list(path.relative_to(base).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def imported(path: Path, module: str) -> Iterator[tuple[int, str]]:
    """(line, absolute module name) of every import in ``module``'s file, nested ones included."""
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                prefix = ".".join(base)
                yield node.lineno, f"{prefix}.{node.module}" if node.module else prefix
            elif node.module:
                yield node.lineno, node.module


def ours(module: str) -> bool:
    """memest's own modules, and lab's: no row lets the product import the lab."""
    return module.split(".")[0] in ("memest", "memest_instrumentation", "lab")


def violations(table: dict[str, set[str]], modules: dict[str, Path]) -> list[str]:
    """Each import of the modules (dotted name → file) that no arrow of the table allows."""
    found = []
    for module, path in modules.items():
        source = package_of(module, table)
        if source is None:
            found.append(f"{module}: its package has no row in the table")
            continue
        allowed = table[source]
        for line, target in imported(path, module):
            if not ours(target):
                continue
            dest = package_of(target, table)
            if dest == source:
                continue
            wild = WILDCARD in allowed and target.split(".")[0] == "memest"
            if dest is None or not (dest in allowed or wild):
                found.append(
                    f"{module}:{line}: {source} imports {target} (not an arrow of the table)"
                )
    return found


def product_modules() -> dict[str, Path]:
    files = sorted([*(ROOT / "memest").rglob("*.py"), *INSTRUMENTATION.rglob("*.py")])
    return {module_name(path): path for path in files}


def test_the_table_has_no_cycle_and_names_every_package() -> None:
    table = arrows()
    assert cycle(table) is None, f"the import arrows go round: {cycle(table)}"
    named = set(table) | {t for targets in table.values() for t in targets}
    assert {
        "memest.schema",
        "memest.snapshot",
        "memest.analysis",
        "memest_instrumentation",
    } <= named


def test_every_import_follows_the_table() -> None:
    assert violations(arrows(), product_modules()) == []


def test_memest_never_imports_instrumentation() -> None:
    table = arrows()
    assert all("memest_instrumentation" not in v for k, v in table.items() if k != WILDCARD)
    back = [
        f"{module}:{line}"
        for module, path in product_modules().items()
        if module.split(".")[0] == "memest"
        for line, target in imported(path, module)
        if target.split(".")[0] == "memest_instrumentation"
    ]
    assert back == []


def test_the_checks_catch_an_arrow_back_up(tmp_path: Path) -> None:
    """The checker itself: a table arrow back up is a cycle; an import back up is a violation."""
    table = arrows()
    backwards = {k: set(v) for k, v in table.items()}
    backwards["memest.schema"].add("memest.analysis")
    assert cycle(backwards) is not None
    planted = {
        "from memest.analysis import replay\n": "memest.analysis",
        "from ..analysis.replay import analyze\n": "memest.analysis.replay",
        "import memest_instrumentation.vllm\n": "memest_instrumentation",
        "from lab.fit import calibrate\n": "lab.fit",
    }
    for n, (line, name) in enumerate(planted.items()):
        probe = tmp_path / f"probe{n}.py"
        probe.write_text(line)
        found = violations(table, {"memest.schema.probe": probe})
        assert len(found) == 1 and name in found[0], found
    # a module imported by name through its package, nested in a function, is still seen
    probe = tmp_path / "nested.py"
    probe.write_text("def f():\n    import memest.cli\n")
    assert len(violations(table, {"memest.plan.nested": probe})) == 1


def test_core_imports_no_heavy_dependency() -> None:
    code = (
        "import sys, json\n"
        "import memest, memest.schema, memest.plan, memest.analysis, memest.estimate, memest.units, memest.preflight\n"
        "print(json.dumps(sorted(m for m in ('torch','fastapi','sqlalchemy','vllm') "
        "if m in sys.modules)))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert json.loads(out.stdout) == []
