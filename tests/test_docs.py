"""The documentation stays true: the README is short, every link and every path it names
exists, and the figures it restates from `make sim` are what the code produces."""

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", ROOT / "CONTRIBUTING.md", *sorted((ROOT / "docs").glob("*.md"))]
#: Top-level folders whose paths the pages may name.
FOLDERS = ("sfnpu", "compiler", "models", "studies", "sim", "hw", "tb", "tools", "cli", "tests",
           "firmware", "docs")


def _anchors(page: Path) -> set[str]:
    """GitHub's anchors of a page's headings."""
    anchors = set()
    for heading in re.findall(r"^#+ (.*)$", page.read_text(), re.M):
        slug = re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")
        anchors.add(slug)
    return anchors


def test_readme_is_short():
    assert (ROOT / "README.md").stat().st_size <= 8192


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_links_resolve(page):
    broken = []
    for target in re.findall(r"\]\(([^)\s]+)\)", page.read_text()):
        if re.match(r"[a-z]+:", target):
            continue
        path, _, anchor = target.partition("#")
        file = (page.parent / path).resolve() if path else page
        if not file.exists():
            broken.append(target)
        elif anchor and file.suffix == ".md" and anchor not in _anchors(file):
            broken.append(target)
    assert not broken, f"{page.name}: broken links {broken}"


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_named_paths_exist(page):
    """A `folder/file` in backquotes names a file or folder of the repository."""
    missing = []
    for path in re.findall(r"`((?:%s)/[\w./-]*)`" % "|".join(FOLDERS), page.read_text()):
        if not (ROOT / path).exists():
            missing.append(path)
    assert not missing, f"{page.name}: no such file or folder {missing}"


def test_make_sim_figures(tmp_path):
    """README: the bundled model's node and group counts and the cycle model's total on `tiny`
    are what compiling it gives (`make sim` prints the same)."""
    from sfnpu.compiler.pipeline import compile_model
    from sfnpu.config import get_config
    from sfnpu.models.catalog import DEFAULT_MODEL, resolve_model
    from sfnpu.sim.cycle import CycleModel

    readme = (ROOT / "README.md").read_text()
    nodes, groups = map(int, re.search(r"(\d+) QDQ nodes → (\d+) groups", readme).groups())
    cycles = int(re.search(r"exact to the cycle \(([\d ]+)\)", readme).group(1).replace(" ", ""))
    config = get_config("tiny")
    path, inputs, _, _ = resolve_model(DEFAULT_MODEL, tmp_path)
    compiled = compile_model(path, config)
    assert (compiled.imported.onnx_nodes, len(compiled.groups)) == (nodes, groups)
    name = compiled.imported.host.prologue.graph.input[0].name
    blob = compiled.program.pack(compiled.quantise_inputs({name: inputs[-1:]}))
    assert CycleModel(config).run(blob).cycles == cycles
