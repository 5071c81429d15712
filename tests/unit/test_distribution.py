"""memest installs under a registry name of its own (the registry's ``memest`` is another project).

Every ``pip install`` that README.md shows, and every one the CLI, the Dockerfile and deploy/
name, installs either this source tree or the distribution pyproject.toml declares.
"""

from __future__ import annotations

import re
import shlex
import tomllib
from pathlib import Path

from packaging.requirements import Requirement

from memest._version import DISTRIBUTION, install_hint

ROOT = Path(__file__).resolve().parents[2]
# `pip install` and what follows it, up to the end of the command (a backtick, &&, ;, ) or a
# line end): quoted or bare words.
_PIP_INSTALL = re.compile(r"pip3? install((?:[ \t]+(?:'[^']*'|\"[^\"]*\"|[^\s`'\"&;)]+))*)")


def _installed_names(text: str) -> list[str]:
    """The distribution names of every requirement a ``pip install`` in ``text`` names.

    Options and local paths (``.``, ``.[service]``, ``dist/x.whl[vllm]``) are not names.
    """
    names = []
    for found in _PIP_INSTALL.finditer(text):
        for word in shlex.split(found.group(1)):
            if word.startswith(("-", ".", "/", "$", "{")) or "/" in word.split("[")[0]:
                continue
            names.append(Requirement(word).name)
    return names


def test_pyproject_declares_the_distribution_name() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert project["name"] == DISTRIBUTION == "vllm-memest"
    # the command and the vLLM entry point keep memest's own names
    assert project["scripts"] == {"memest": "memest.cli:entry"}
    assert project["entry-points"]["vllm.general_plugins"] == {
        "memest": "memest_instrumentation.vllm:register"
    }


def test_readme_installs_only_this_distribution() -> None:
    names = _installed_names((ROOT / "README.md").read_text())
    assert names, "README.md shows no pip install of the distribution"
    assert set(names) == {DISTRIBUTION}, names


def test_cli_docker_and_deploy_hints_name_this_distribution() -> None:
    files = [ROOT / "Dockerfile", *sorted((ROOT / "deploy").rglob("*"))]
    files += sorted((ROOT / "memest").rglob("*.py")) + sorted(
        (ROOT / "instrumentation").rglob("*.py")
    )
    named = {
        f"{path.relative_to(ROOT)}: {name}"
        for path in files
        if path.is_file()
        for name in _installed_names(path.read_text(errors="replace"))
        if name != DISTRIBUTION
    }
    assert not named, sorted(named)
    assert "'memest[" not in (ROOT / "Dockerfile").read_text()


def test_the_parser_sees_what_a_user_would_type() -> None:
    """The check above is only as good as its parser: it finds each name a user would install."""
    text = (
        "run `pip install 'memest[plots]'` or\n"
        "python3 -m venv v && v/bin/pip install -e '.[service]' && pip install vllm==0.33.0\n"
        'RUN pip install --no-index --find-links=/wheels "other-dist[a,b]>=1" && rm -rf /wheels\n'
    )
    assert _installed_names(text) == ["memest", "vllm", "other-dist"]


def test_extra_hints_install_the_extras_requirements() -> None:
    """A hint installs what the extra needs, however memest was installed (no registry release
    is needed): the plots extra is matplotlib with pyproject.toml's bound."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    for extra in ("plots", "service"):
        hinted = shlex.split(install_hint(extra).removeprefix("pip install "))
        declared = project["optional-dependencies"][extra]
        assert [Requirement(r) for r in hinted] == [Requirement(r) for r in declared], extra
