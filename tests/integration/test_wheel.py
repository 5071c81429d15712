"""memest as a user gets it: `bash scripts/build_release.sh` (`python -m build`: the sdist and,
from it, the wheel); the wheel installs into a fresh venv beside each vLLM memest supports (0.33.0
in the test interpreter's environment, 0.34.0 in .venv-vllm034, which scripts/test-vllm034.sh
makes), where vLLM's own load_general_plugins() finds it.

Each fresh venv reuses that vLLM environment's installed packages (vLLM is never installed again)
through a site folder of links to them that leaves out every memest distribution (the editable
install's dist-info declares the same entry point), so the entry point vLLM finds can only be the
wheel's, and the source tree is off sys.path (no PYTHONPATH, another working folder).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from memest._version import DISTRIBUTION, __version__
from tests.conftest import require_or_skip, require_tool

pytestmark = pytest.mark.deploy

ROOT = Path(__file__).resolve().parents[2]
# What the Dockerfile copies too: all that building needs.
SOURCES = ("pyproject.toml", "README.md", "memest", "instrumentation")
BUILD_SCRIPT = "scripts/build_release.sh"
BUILD_TIMEOUT_S = 300

PROBE = r"""
import importlib.metadata as md, json, sys
import vllm.plugins as vp
vp.load_general_plugins()
import memest, memest_instrumentation
import memest_instrumentation.vllm as plugin
from memest_instrumentation.vllm.patches import ORIGINAL_ATTR, current
from memest_instrumentation.vllm.state import state
found = [
    {"name": ep.name, "value": ep.value, "dist": ep.dist.name if ep.dist else None}
    for ep in md.entry_points(group=vp.DEFAULT_PLUGINS_GROUP)
]
wrapped = [p.target for p in plugin.patches() if getattr(current(p), ORIGINAL_ATTR, None) is not None]
print("PROBE " + json.dumps({
    "entry_points": found,
    "memest": memest.__file__,
    "plugin": plugin.__file__,
    "wrapped": wrapped,
    "targets": len(plugin.patches()),
    "errors": state().hook_errors,
    "vllm": md.version("vllm"),
}))
"""


def _run(cmd: list[str], **kw: object) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(cmd, capture_output=True, text=True, check=False, **kw)  # type: ignore[call-overload]
    assert done.returncode == 0, f"{cmd}\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    return done  # type: ignore[no-any-return]


@pytest.fixture(scope="module")
def dists(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """(wheel, sdist) built by scripts/build_release.sh from a clean copy of the sources, or the
    ones in the folder MEMEST_WHEEL names (the release workflow tests the files it publishes)."""
    given = os.environ.get("MEMEST_WHEEL")
    if given:
        return _one(Path(given), "*.whl"), _one(Path(given), "*.tar.gz")
    require_tool("build")
    tmp = tmp_path_factory.mktemp("dist")
    src = tmp / "src"
    src.mkdir()
    for name in SOURCES:
        path = ROOT / name
        if path.is_dir():
            shutil.copytree(path, src / name, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copy2(path, src / name)
    (src / "scripts").mkdir()
    shutil.copy2(ROOT / BUILD_SCRIPT, src / BUILD_SCRIPT)
    # The release command as the README gives it; PYTHON: the interpreter whose `build` it runs.
    env = {**os.environ, "PYTHON": sys.executable}
    _run(
        ["bash", str(src / BUILD_SCRIPT), str(tmp / "out")],
        env=env,
        cwd=src,
        timeout=BUILD_TIMEOUT_S,
    )
    return _one(tmp / "out", "*.whl"), _one(tmp / "out", "*.tar.gz")


def _one(folder: Path, pattern: str) -> Path:
    found = sorted(folder.glob(pattern))
    assert len(found) == 1, f"{folder}: expected one {pattern}, found {found}"
    return found[0]


def _package_files() -> set[str]:
    """Every file of the two import packages in the source tree, as wheel paths."""
    files = set()
    for top, base in (("memest", ROOT), ("memest_instrumentation", ROOT / "instrumentation")):
        for path in (base / top).rglob("*"):
            if path.is_file() and "__pycache__" not in path.parts:
                files.add(path.relative_to(base).as_posix())
    return files


def test_wheel_carries_every_package_file(dists: tuple[Path, Path]) -> None:
    wheel, _ = dists
    assert wheel.name == f"vllm_memest-{__version__}-py3-none-any.whl"
    names = set(zipfile.ZipFile(wheel).namelist())
    missing = _package_files() - names
    assert not missing, sorted(missing)
    # The files the issue names, by name: a glob in pyproject.toml that stops matching them fails
    # here even if the source tree lost them too.
    for required in (
        "memest/schema/json/run-report.v1.json",
        "memest/schema/json/preflight.v1.json",
        "memest/preflight/data/h200-vllm-0.33.0.json",
        "memest/service/static/memest.js",
        "memest/service/static/memest.css",
        "memest/service/static/whatif.js",
        "memest/service/templates/index.html",
        "memest/service/grafana/memest-dashboard.json",
        "memest/service/migrations/script.py.mako",
        "memest/py.typed",
        "memest_instrumentation/vllm/__init__.py",
    ):
        assert required in names, required


def test_wheel_metadata_names_the_distribution_command_and_plugin(dists: tuple[Path, Path]) -> None:
    wheel, _ = dists
    info = f"vllm_memest-{__version__}.dist-info"
    with zipfile.ZipFile(wheel) as zf:
        metadata = zf.read(f"{info}/METADATA").decode()
        entry_points = zf.read(f"{info}/entry_points.txt").decode()
    assert f"Name: {DISTRIBUTION}\n" in metadata
    assert 'Requires-Dist: vllm<0.35,>=0.33.0; extra == "vllm"' in metadata
    assert "[console_scripts]\nmemest = memest.cli:entry" in entry_points
    assert "[vllm.general_plugins]\nmemest = memest_instrumentation.vllm:register" in entry_points


def test_sdist_holds_the_sources(dists: tuple[Path, Path]) -> None:
    import tarfile

    _, sdist = dists
    prefix = f"vllm_memest-{__version__}/"
    with tarfile.open(sdist) as tf:
        names = {n.removeprefix(prefix) for n in tf.getnames()}
    sources = {
        f"instrumentation/{f}" if f.startswith("memest_instrumentation/") else f
        for f in _package_files()
    }
    assert not sources - names, sorted(sources - names)[:20]
    assert {"pyproject.toml", "README.md"} <= names


#: The vLLM versions memest supports, each with the interpreter of an environment that has it:
#: the test interpreter (0.33.0, the [vllm] extra) and .venv-vllm034 (scripts/test-vllm034.sh).
VLLM_ENVS = {
    "0.33.0": Path(sys.executable),
    "0.34.0": ROOT / ".venv-vllm034" / "bin" / "python",
}

SITE_DIRS = "import json, site, sysconfig; print(json.dumps(site.getsitepackages() + [sysconfig.get_paths()['purelib']]))"
VERSION_PROBE = "import importlib.metadata as md; print(md.version('vllm'))"


def _site_dirs(python: Path) -> list[Path]:
    """Every site folder ``python`` reads, its own first (a --system-site-packages venv's base after)."""
    found = json.loads(_run([str(python), "-c", SITE_DIRS]).stdout)
    out: list[Path] = []
    for entry in found:
        path = Path(entry)
        if path.is_dir() and path not in out:
            out.append(path)
    return out


def _deps_without_memest(tmp: Path, python: Path) -> Path:
    """A site folder of links to ``python``'s installed packages, memest's own left out."""
    deps = tmp / "deps"
    deps.mkdir()
    for site_dir in _site_dirs(python):
        for entry in site_dir.iterdir():
            if "memest" in entry.name.lower() or (deps / entry.name).exists():
                continue  # the editable install (dist-info, .pth, finder); the first copy wins
            (deps / entry.name).symlink_to(entry)
    return deps


def _vllm_python(version: str) -> Path:
    """The interpreter of the environment with vLLM ``version``, checked by asking it."""
    python = VLLM_ENVS[version]
    if not python.exists():
        require_or_skip("MEMEST_REQUIRE_VLLM", f"no environment with vLLM {version}: {python}")
    found = subprocess.run(
        [str(python), "-c", VERSION_PROBE], capture_output=True, text=True, check=False
    )
    if found.returncode != 0 or found.stdout.strip() != version:
        require_or_skip(
            "MEMEST_REQUIRE_VLLM",
            f"no vLLM {version} at {python}: {(found.stderr or found.stdout).strip()[-300:]}",
        )
    return python


@pytest.fixture(scope="module", params=sorted(VLLM_ENVS), ids=lambda v: f"vllm-{v}")
def fresh_venv(
    request: pytest.FixtureRequest,
    dists: tuple[Path, Path],
    tmp_path_factory: pytest.TempPathFactory,
) -> tuple[str, Path]:
    """(vLLM version, a new venv with the wheel installed and that vLLM's packages linked)."""
    version: str = request.param
    base = _vllm_python(version)
    tmp = tmp_path_factory.mktemp(f"venv-{version}")
    venv = tmp / "venv"
    _run([str(base), "-m", "venv", "--without-pip", str(venv)])
    python = venv / "bin" / "python"
    site_dir = Path(
        _run(
            [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"]
        ).stdout.strip()
    )
    # addsitedir, not a bare path: the linked folder's own .pth files are processed too.
    deps = _deps_without_memest(tmp, base)
    (site_dir / "zz-dependencies.pth").write_text(f"import site; site.addsitedir({str(deps)!r})\n")
    # Away from the checkout and its PYTHONPATH: the editable install's *.egg-info folders in the
    # repository root would tell pip that vllm-memest is installed already.
    _run(
        [sys.executable, "-m", "pip", "--python", str(python), "install", "-q", "--no-deps"]
        + ["--no-index", str(dists[0])],
        env=_venv_env(venv),
        cwd=tmp,
        timeout=BUILD_TIMEOUT_S,
    )
    return version, venv


def _venv_env(venv: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MEMEST_", "PYTHON"))}
    env["PATH"] = f"{venv / 'bin'}{os.pathsep}{env.get('PATH', '')}"
    env["VIRTUAL_ENV"] = str(venv)
    return env


@pytest.mark.vllm
def test_vllm_loads_the_plugin_from_the_wheel(fresh_venv: tuple[str, Path], tmp_path: Path) -> None:
    version, venv = fresh_venv
    env = _venv_env(venv)
    env.update({"MEMEST_ENABLE": "1", "MEMEST_RUN_ID": "wheel", "MEMEST_OUTPUT_DIR": str(tmp_path)})
    done = _run([str(venv / "bin" / "python"), "-c", PROBE], env=env, cwd=tmp_path, timeout=300)
    (line,) = [ln for ln in done.stdout.splitlines() if ln.startswith("PROBE ")]
    res = json.loads(line.removeprefix("PROBE "))
    ours = [ep for ep in res["entry_points"] if ep["name"] == "memest"]
    assert ours == [
        {"name": "memest", "value": "memest_instrumentation.vllm:register", "dist": DISTRIBUTION}
    ], res["entry_points"]
    for module in ("memest", "plugin"):
        assert Path(res[module]).is_relative_to(venv), (module, res[module])
    assert res["vllm"] == version
    assert not Path(res["plugin"]).is_relative_to(ROOT)
    # register() ran: every target vLLM imported on loading plugins is wrapped, none failed
    assert res["wrapped"] and len(res["wrapped"]) == res["targets"], res
    assert res["errors"] == []


@pytest.mark.vllm
def test_installed_command_runs(fresh_venv: tuple[str, Path], tmp_path: Path) -> None:
    _, venv = fresh_venv
    env = _venv_env(venv)
    memest = str(venv / "bin" / "memest")
    version = _run([memest, "--version"], env=env, cwd=tmp_path)
    assert version.stdout.strip() == f"memest {__version__}"
    plan = _run([memest, "plan", "--json"], env=env, cwd=tmp_path)
    assert "vllm-0.33.0" in json.loads(plan.stdout)
    # the pre-flight calibration is read from the installed package data
    config = tmp_path / "config.json"
    shutil.copy(ROOT / "tests/data/configs/llama8b.json", config)
    pre = _run(
        [memest, "preflight", "--model-config", str(config), "--gpu", "h200", "--json"],
        env=env,
        cwd=tmp_path,
    )
    assert json.loads(pre.stdout)["calibration"].startswith("h200 + vLLM 0.33.0")
