"""Dependencies point one way: contracts ← hw ← sim ← compiler ← models ← studies ← tb ←
tools ← cli. Every import in every module, at its top or inside a function, is checked."""

import ast
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE_DIRS = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"][
    "package-dir"]
#: Each package may import only from the packages before it (and itself).
LAYERS = ("sfnpu", "sfnpu.hw", "sfnpu.sim", "sfnpu.compiler", "sfnpu.models", "sfnpu.studies",
          "sfnpu.tb", "sfnpu.tools", "sfnpu.cli")


def _package_of(module: str) -> str:
    """The mapped package a module name belongs to (the longest mapped prefix)."""
    parts = module.split(".")
    for n in range(len(parts), 0, -1):
        if ".".join(parts[:n]) in PACKAGE_DIRS:
            return ".".join(parts[:n])
    return None


def _modules(package: str):
    folder = ROOT / PACKAGE_DIRS[package]
    for path in sorted(folder.rglob("*.py")):
        rel = path.relative_to(folder).with_suffix("")
        parts = [p for p in rel.parts if p != "__init__"]
        is_package = path.name == "__init__.py"
        yield path, ".".join([package, *parts]), is_package


def _imports(path: Path, module: str, is_package: bool):
    """(line, imported module) for every import of an sfnpu module."""
    here = module.split(".") if is_package else module.split(".")[:-1]
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = here[:len(here) - (node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module
            yield node.lineno, target
            for alias in node.names:  # `from sfnpu import hw` imports the package hw
                yield node.lineno, f"{target}.{alias.name}"


def test_every_mapped_package_has_a_layer():
    assert set(PACKAGE_DIRS) == set(LAYERS)


@pytest.mark.parametrize("package", LAYERS)
def test_imports_point_down(package):
    allowed = set(LAYERS[:LAYERS.index(package) + 1])
    wrong = []
    for path, module, is_package in _modules(package):
        for line, target in _imports(path, module, is_package):
            if target.split(".")[0] != "sfnpu":
                continue
            owner = _package_of(target)
            if owner is not None and owner not in allowed:
                wrong.append(f"{path.relative_to(ROOT)}:{line} imports {target} ({owner})")
    assert not wrong, "imports against the layering:\n" + "\n".join(wrong)


def test_the_check_sees_a_wrong_import(tmp_path):
    """An import upward is found, whether absolute or relative."""
    bad = tmp_path / "limits.py"
    bad.write_text("from .hw import conv_array\nimport sfnpu.tb.system\n")
    owners = {_package_of(t) for _, t in _imports(bad, "sfnpu.limits", False)}
    assert {"sfnpu.hw", "sfnpu.tb"} <= owners
