"""The size limits of docs/development.md, read from the source with `ast`: no module of
allocscope/, common/, reports/ or tracer/ over 600 lines, no class over 300 (from its `class`
line to its last line: ClassDef end_lineno - lineno + 1), and README.md not over 400 lines (its
details belong in docs/*.md)."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SHIPPED = ("allocscope", "common", "reports", "tracer")
MODULE_LINES = 600
CLASS_LINES = 300
README_LINES = 400


def sizes(root: Path) -> tuple[dict[str, int], dict[str, int]]:
    """(module path -> lines, "path:Class" -> lines) of every .py file under SHIPPED."""
    modules, classes = {}, {}
    for folder in SHIPPED:
        for path in sorted((root / folder).rglob("*.py")):
            src = path.read_text()
            rel = path.relative_to(root).as_posix()
            modules[rel] = len(src.splitlines())
            for node in ast.walk(ast.parse(src, rel)):
                if isinstance(node, ast.ClassDef):
                    classes[f"{rel}:{node.name}"] = (node.end_lineno or node.lineno) - node.lineno + 1
    return modules, classes


def over(root: Path) -> list[str]:
    modules, classes = sizes(root)
    return [f"{m}: {n} lines (module limit {MODULE_LINES})" for m, n in modules.items() if n > MODULE_LINES] + [
        f"{c}: {n} lines (class limit {CLASS_LINES})" for c, n in classes.items() if n > CLASS_LINES
    ]


def test_no_module_or_class_over_its_limit():
    modules, classes = sizes(ROOT)
    assert len(modules) > 100 and len(classes) > 100  # the walk found the code
    assert "tracer/record/recorder.py:Recorder" in classes
    assert over(ROOT) == []


def test_the_limit_check_catches_what_it_is_for(tmp_path):
    """A module of 601 lines and a class of 301 (nested in a function too) are caught; 600 and
    300 pass; folders outside the four (tests/, bench/) are not measured."""
    body = "    x = 1\n"
    files = {
        "tracer/long.py": "x = 1\n" * 601,
        "tracer/ok.py": "x = 1\n" * 600,
        "common/big.py": "class Big:\n" + body * 300,
        "reports/fits.py": "class Fits:\n" + body * 299,
        "allocscope/inner.py": "def f():\n    class Inner:\n" + "        x = 1\n" * 300,
        "bench/huge.py": "x = 1\n" * 700,
    }
    for rel, text in files.items():
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(text)
    assert over(tmp_path) == [
        "tracer/long.py: 601 lines (module limit 600)",
        "allocscope/inner.py:Inner: 301 lines (class limit 300)",
        "common/big.py:Big: 301 lines (class limit 300)",
    ]


def readme_over(root: Path) -> list[str]:
    n = len((root / "README.md").read_text().splitlines())
    return [f"README.md: {n} lines (limit {README_LINES})"] if n > README_LINES else []


def test_readme_within_its_limit(tmp_path):
    """README.md of 401 lines is caught, 400 passes; the real one is measured, not assumed."""
    assert len((ROOT / "README.md").read_text().splitlines()) > 100  # the real README was read
    assert readme_over(ROOT) == []
    (tmp_path / "README.md").write_text("line\n" * 400)
    assert readme_over(tmp_path) == []
    (tmp_path / "README.md").write_text("line\n" * 401)
    assert readme_over(tmp_path) == ["README.md: 401 lines (limit 400)"]
