"""README documents every CLI command and every MEMEST_* setting (plugin and service), and
documents nothing that no code reads."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest
from memest_instrumentation.vllm.env import ENV_VARS

from memest.cli import _commands

ROOT = Path(__file__).resolve().parents[2]
README = (ROOT / "README.md").read_text()
ENV_MODULE = ROOT / "instrumentation/memest_instrumentation/vllm/env.py"


def _product() -> list[Path]:
    files = [*(ROOT / "memest").rglob("*.py"), *(ROOT / "instrumentation").rglob("*.py")]
    return sorted(p for p in files if p != ENV_MODULE)


def _sources() -> list[Path]:
    """Where a setting may be read: the product, and the test suite's own switches
    (MEMEST_REQUIRE_*, read by the tests that would otherwise skip)."""
    switches = [p for p in (ROOT / "tests").rglob("*.py") if "require_or_skip(" in p.read_text()]
    return [*_product(), *switches]


def _attributes_read() -> set[str]:
    """Every attribute name the product reads outside env.py (``settings.work_budget_s`` ...)."""
    return {
        node.attr
        for path in _product()
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.Attribute)
    }


def _plugin_fields() -> dict[str, str]:
    """MEMEST_* name → the Settings field Settings.from_env stores it in (through the local
    names it is parsed into on the way)."""
    tree = ast.parse(ENV_MODULE.read_text())
    from_env = next(
        n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef) and n.name == "from_env"
    )
    assigned: dict[str, list[ast.AST]] = {}
    for node in ast.walk(from_env):
        if isinstance(node, ast.Assign | ast.AnnAssign):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for t in targets:
                if isinstance(t, ast.Name) and node.value is not None:
                    assigned.setdefault(t.id, []).append(node.value)

    def names(node: ast.AST, seen: frozenset[str] = frozenset()) -> set[str]:
        found = set()
        for c in ast.walk(node):
            if isinstance(c, ast.Constant) and str(c.value).startswith("MEMEST_"):
                found.add(str(c.value))
            elif isinstance(c, ast.Name) and c.id in assigned and c.id not in seen:
                for value in assigned[c.id]:
                    found |= names(value, seen | {c.id})
        return found

    fields: dict[str, str] = {}
    for node in ast.walk(from_env):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "cls":
            for kw in node.keywords:
                fields.update({name: str(kw.arg) for name in names(kw.value)})
    return fields


def _readme_defaults() -> dict[str, str]:
    """Each README settings-table row's name and default ("" for an empty default cell)."""
    rows = re.findall(r"^\| `(MEMEST_[A-Z0-9_]+)` \| (?:`([^`]*)`)? *\|", README, re.M)
    return dict(rows)


@pytest.mark.parametrize("name", [c.name for c in _commands()])
def test_every_command_is_in_the_readme(name: str) -> None:
    assert f"memest {name}" in README


@pytest.mark.parametrize("name", [v.name for v in ENV_VARS])
def test_every_plugin_setting_is_in_the_readme(name: str) -> None:
    assert f"`{name}`" in README


def test_every_service_setting_is_in_the_readme() -> None:
    from memest.service.config import Settings

    missing = [n for n in Settings.model_fields if f"`MEMEST_{n.upper()}`" not in README]
    assert missing == []


def test_the_readme_defaults_are_the_plugins() -> None:
    documented = _readme_defaults()
    assert {v.name: documented.get(v.name) for v in ENV_VARS} == {
        v.name: v.default for v in ENV_VARS
    }


def test_every_plugin_setting_is_read_by_the_plugin() -> None:
    """A setting parsed into Settings that no code reads (a dead knob) fails here."""
    fields = _plugin_fields()
    assert set(fields) == {v.name for v in ENV_VARS}, "a setting Settings.from_env does not parse"
    read = _attributes_read()
    unread = sorted(name for name, field in fields.items() if field not in read)
    assert unread == []


def test_every_service_setting_is_read() -> None:
    from memest.service.config import Settings

    read = _attributes_read()
    assert sorted(n for n in Settings.model_fields if n not in read) == []


def test_every_setting_the_readme_names_exists() -> None:
    """A MEMEST_* name in the README is a plugin or service setting, or a name the code reads."""
    from memest.service.config import Settings

    known = {v.name for v in ENV_VARS} | {f"MEMEST_{n.upper()}" for n in Settings.model_fields}
    code = "\n".join(p.read_text() for p in _sources())
    named = set(re.findall(r"MEMEST_[A-Z0-9_]*[A-Z0-9]", README))
    unknown = sorted(n for n in named - known if f'"{n}"' not in code)
    assert unknown == []


def test_the_checks_catch_a_dead_setting() -> None:
    """The checker itself: a field nobody reads, and a README name nothing reads."""
    assert "stack_depth" not in _attributes_read()
    assert "work_budget_s" in _attributes_read()
    assert _readme_defaults()["MEMEST_ENABLE"] == "0" and _readme_defaults()["MEMEST_RULES"] == ""


def test_the_readme_defaults_are_the_services() -> None:
    from memest.service.config import Settings

    def shown(value: object) -> str:
        if value is None:
            return ""
        return str(int(value)) if isinstance(value, bool) else str(value)

    documented = _readme_defaults()
    fields = Settings.model_fields
    assert {f"MEMEST_{n.upper()}": documented.get(f"MEMEST_{n.upper()}") for n in fields} == {
        f"MEMEST_{n.upper()}": shown(f.default) for n, f in fields.items()
    }
