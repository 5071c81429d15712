"""The term model's layering: every term is built once, in memest.estimate.terms.catalog.

- the catalog has one object per FullInitTerms term, each with a reader, the plugin's reading,
  a law and a mover;
- no ``FullInitTerms(...)`` call outside the catalog names a term (they take the catalog's
  loops: read_terms, plugin_terms, laws, moved_terms);
- the pre-flight holds no law of its own: no module of memest/preflight reads a law's
  coefficient or imports a law's building block.
"""

from __future__ import annotations

import ast
from pathlib import Path

from memest.estimate.phases import TERM_FIELDS
from memest.estimate.terms.catalog import TERMS
from memest.estimate.terms.coefficients import Coefficients

ROOT = Path(__file__).resolve().parents[3]
MEMEST = ROOT / "memest"
TERM_NAMES = {t for t in TERM_FIELDS if t != "margin_bytes"}
#: Modules whose functions size a term: the pre-flight reaches them through the catalog only.
LAW_MODULES = {
    "memest.estimate.activation",
    "memest.estimate.sampler",
    "memest.estimate.mla_context",
    "memest.estimate.runner_buffers",
    "memest.estimate.fused_moe",
    "memest.estimate.synthetic_trace",
    "memest.estimate.terms.shape",
    "memest.estimate.terms.context",
}
#: Types a request is resolved into, not laws.
SETUP_TYPES = {"IndexerDecode"}
#: The calibration's data file hands the what-if its factor: data, not a law.
CALIBRATION = "calibration.py"


def _modules(folder: Path) -> list[tuple[Path, ast.Module]]:
    return [(p, ast.parse(p.read_text())) for p in sorted(folder.rglob("*.py"))]


def test_every_term_is_one_object_with_reader_plugin_law_and_mover() -> None:
    assert [t.field for t in TERMS] == [t for t in TERM_FIELDS if t in TERM_NAMES]
    for t in TERMS:
        assert callable(t.read) and callable(t.plugin) and callable(t.law) and callable(t.move)


def _term_keywords(tree: ast.Module) -> list[tuple[int, str]]:
    """(line, term) of every FullInitTerms(...) call naming a term by keyword."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            name = getattr(node.func, "id", getattr(node.func, "attr", ""))
            if name == "FullInitTerms":
                found += [(node.lineno, k.arg) for k in node.keywords if k.arg in TERM_NAMES]
    return found


def test_no_term_is_constructed_outside_the_catalog() -> None:
    catalog = MEMEST / "estimate/terms/catalog.py"
    offenders = [
        f"{p.relative_to(ROOT)}:{line} {term}"
        for p, tree in _modules(MEMEST)
        if p != catalog
        for line, term in _term_keywords(tree)
    ]
    assert offenders == []


def test_the_preflight_holds_no_law_of_its_own() -> None:
    coefficients = set(Coefficients.model_fields)
    offenders = []
    for p, tree in _modules(MEMEST / "preflight"):
        for node in ast.walk(tree):
            reads = isinstance(node, ast.Attribute) and node.attr in coefficients
            if reads and p.name != CALIBRATION:
                offenders.append(f"{p.name}:{node.lineno} reads coefficient {node.attr}")
            if isinstance(node, ast.ImportFrom) and node.module in LAW_MODULES:
                names = {a.name for a in node.names} - SETUP_TYPES
                if names:
                    offenders.append(f"{p.name}:{node.lineno} imports {node.module} {names}")
    assert offenders == []
