"""`allocscope --version` and `--help` the way the relocatable bundle runs them, and from a source
checkout that was never installed: with no package metadata for allocscope anywhere (the bundle
carries none: click's lookup of it ended in a traceback there).

`make bundle` takes minutes (150 s measured here, on a busy box, most of it xz), so the bundle is
not built: its launcher (bundle/allocscope, bundle/bootstrap.py) runs from a folder of the
bundle's shape — the packages copied into python/ (copied, not linked: a link would lead back to
this checkout's pyproject.toml), a VERSION file as scripts/bundle.sh writes, no BCC libraries to
preload — with this box's python, its site-packages seen without allocscope's metadata (nor the
editable install's finder). The bundle and the fresh checkout say versions of their own, so each
run shows where it read its version.
"""

from __future__ import annotations

import importlib.util
import marshal
import os
import shutil
import subprocess
import sys
import sysconfig
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("allocscope", "common", "tracer", "reports", "probes")
# what the copies below say they are: each run must print its own copy's version
BUNDLE_VERSION, CHECKOUT_VERSION = "9.8.6", "9.8.7"


def _copy_packages(dest: Path) -> None:
    for p in PACKAGES:
        shutil.copytree(ROOT / p, dest / p, ignore=shutil.ignore_patterns("__pycache__", "*.so"))


@pytest.fixture(scope="module")
def bare(tmp_path_factory) -> dict:
    """A python that sees this box's packages but no allocscope metadata (`python`: a wrapper
    running it with -S and the filtered site-packages on PYTHONPATH); a bundle-shaped folder
    (`bundle`); a fresh checkout, never installed (`checkout`: the packages and pyproject.toml)."""
    d = tmp_path_factory.mktemp("bare")
    site = d / "site"
    site.mkdir()
    src = Path(sysconfig.get_paths()["purelib"])
    for p in src.iterdir():
        if p.name.startswith(("allocscope", "__editable__")) or p.suffix == ".pth":
            continue
        (site / p.name).symlink_to(p)
    python = d / "python3"
    python.write_text(f'#!/bin/sh\nPYTHONPATH="{site}${{PYTHONPATH:+:$PYTHONPATH}}" exec {sys.executable} -S "$@"\n')
    python.chmod(0o755)
    b = d / "allocscope-bundle"
    for sub in ("bin", "libexec", "lib", "python"):
        (b / sub).mkdir(parents=True)
    shutil.copy(ROOT / "bundle" / "allocscope", b / "bin" / "allocscope")
    shutil.copy(ROOT / "bundle" / "bootstrap.py", b / "libexec" / "bootstrap.py")
    (b / "lib" / "ORDER").write_text("")
    _copy_packages(b / "python")
    (b / "VERSION").write_text(BUNDLE_VERSION + "\n")
    c = d / "checkout"
    _copy_packages(c)
    py = (ROOT / "pyproject.toml").read_text()
    version = tomllib.loads(py)["project"]["version"]
    (c / "pyproject.toml").write_text(py.replace(f'version = "{version}"', f'version = "{CHECKOUT_VERSION}"', 1))
    return {"python": python, "bundle": b, "checkout": c, "cwd": d}


def _run(cmd: list, cwd: Path, **env) -> subprocess.CompletedProcess:
    """`cmd` in `cwd` (not the checkout here: the editable install left allocscope.egg-info in
    it, metadata that python -c/-m would find there)."""
    e = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "ALLOCSCOPE_PYTHON")}
    return subprocess.run([str(c) for c in cmd], capture_output=True, text=True, timeout=60, env={**e, **env}, cwd=cwd)


def test_no_metadata_in_the_bare_python(bare):
    # what the other tests rely on: this python cannot find allocscope's metadata
    r = _run(
        [bare["python"], "-c", "import importlib.metadata as m; m.version('allocscope')"],
        bare["cwd"],
        PYTHONPATH=str(bare["checkout"]),
    )
    assert r.returncode == 1 and "PackageNotFoundError" in r.stderr, r.stderr


def test_version_and_help_from_the_bundle(bare):
    launcher = bare["bundle"] / "bin" / "allocscope"
    r = _run([launcher, "--version"], bare["cwd"], ALLOCSCOPE_PYTHON=str(bare["python"]))
    assert (r.returncode, r.stdout, r.stderr) == (0, f"allocscope, version {BUNDLE_VERSION}\n", "")
    r = _run([launcher, "--help"], bare["cwd"], ALLOCSCOPE_PYTHON=str(bare["python"]))
    assert r.returncode == 0 and r.stderr == "", r.stderr
    assert r.stdout.startswith("Usage: allocscope [OPTIONS] COMMAND [ARGS]...")
    assert {"record", "report", "top", "diff", "doctor", "--version"} <= set(r.stdout.split())


def test_version_and_help_from_a_checkout(bare):
    env = {"PYTHONPATH": str(bare["checkout"])}
    r = _run([bare["python"], "-m", "allocscope", "--version"], bare["cwd"], **env)
    assert (r.returncode, r.stdout, r.stderr) == (0, f"allocscope, version {CHECKOUT_VERSION}\n", "")
    r = _run([bare["python"], "-m", "allocscope", "--help"], bare["cwd"], **env)
    assert r.returncode == 0 and r.stderr == "" and "record" in r.stdout.split(), r.stderr


def test_the_bundle_keeps_its_bytecode_where_the_box_says_not_to_write_any(bare, tmp_path):
    """PYTHONDONTWRITEBYTECODE=1 (the GPU box's environment sets it): the bundle still keeps the
    bytecode of its own modules (bundle/bootstrap.py _KeepBytecode), so a second start reads
    them instead of compiling allocscope again (0.6-0.9 s of a warm start there); the pycs are
    valid timestamp pycs of their sources, and a second start leaves them as they are."""
    b = tmp_path / "b"
    shutil.copytree(bare["bundle"], b, ignore=shutil.ignore_patterns("__pycache__"))
    launcher = b / "bin" / "allocscope"
    r = _run([launcher, "--help"], bare["cwd"], ALLOCSCOPE_PYTHON=str(bare["python"]), PYTHONDONTWRITEBYTECODE="1")
    assert r.returncode == 0 and r.stderr == "", r.stderr
    tag = sys.implementation.cache_tag
    pycs = sorted(b.rglob(f"*.{tag}.pyc"))
    names = {p.relative_to(b / "python").as_posix() for p in pycs}
    assert f"allocscope/__pycache__/__init__.{tag}.pyc" in names
    assert f"allocscope/cli/__pycache__/app.{tag}.pyc" in names
    assert all(n.split("/")[0] in PACKAGES for n in names), names
    for p in pycs:
        src = p.parent.parent / (p.name.split(".")[0] + ".py")
        data = p.read_bytes()
        st = src.stat()
        assert data[:4] == importlib.util.MAGIC_NUMBER and data[4:8] == b"\0\0\0\0"
        assert int.from_bytes(data[8:12], "little") == int(st.st_mtime)
        assert int.from_bytes(data[12:16], "little") == st.st_size
        assert marshal.loads(data[16:]).co_filename == str(src)
    before = {p: p.stat().st_mtime_ns for p in pycs}
    r = _run([launcher, "--version"], bare["cwd"], ALLOCSCOPE_PYTHON=str(bare["python"]), PYTHONDONTWRITEBYTECODE="1")
    assert (r.returncode, r.stdout) == (0, f"allocscope, version {BUNDLE_VERSION}\n"), r.stderr
    assert {p: p.stat().st_mtime_ns for p in pycs} == before
