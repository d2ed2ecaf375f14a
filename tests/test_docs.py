"""The docs say what the tree holds: docs/architecture.md's module map names every module of the
package's folders and of scripts/, each once, and nothing that is not there."""

from __future__ import annotations

import ast
import re
from pathlib import Path

from tests.clusterkit import ROOT

#: The folders whose every module the map lists, one line each (``__init__.py`` aside).
MAPPED = ("client", "node", "cluster", "pipeline", "sim", "scripts")


def _module_map() -> list[tuple[str, str]]:
    """The (path, description) lines of the code block under "## Modules"."""
    text = Path(ROOT, "docs", "architecture.md").read_text()
    section = text.split("\n## Modules\n", 1)[1]
    block = re.search(r"^```\n(.*?)^```$", section, re.S | re.M)
    assert block, 'docs/architecture.md: no code block under "## Modules"'
    rows = []
    for line in block.group(1).splitlines():
        path, _, what = line.partition(" ")
        rows.append((path, what.strip()))
    return rows


def test_the_module_map_lists_exactly_the_modules_that_exist():
    rows = _module_map()
    listed = [path for path, _ in rows if path.endswith(".py")]
    assert len(listed) == len(set(listed)), f"listed twice: {sorted({p for p in listed if listed.count(p) > 1})}"
    on_disk = {p.relative_to(ROOT).as_posix() for folder in MAPPED for p in Path(ROOT, folder).rglob("*.py")
               if p.name != "__init__.py" and "__pycache__" not in p.parts}  # fmt: skip
    assert sorted(on_disk - set(listed)) == [], "modules missing from docs/architecture.md's module map"
    assert sorted(set(listed) - on_disk) == [], "docs/architecture.md's module map lists modules that do not exist"
    assert all(path.split("/")[0] in MAPPED for path in listed)
    for path, what in rows:
        assert what, f"{path}: the map says nothing of what it holds"
        if path.endswith("/"):
            assert Path(ROOT, path).is_dir(), f"{path} is not a folder"


def test_the_module_map_names_the_namespace_modules_of_roost():
    (what,) = [what for path, what in _module_map() if path == "roost/"]
    named = set(re.findall(r"[\w]+\.py", what))
    assert named == {p.name for p in Path(ROOT, "roost").glob("*.py") if not p.name.startswith("__")}
    links = {p.name for p in Path(ROOT, "roost").iterdir() if p.is_symlink()}
    assert links == set(re.findall(r"(\w+)/", what))


#: Where docs/architecture.md says the layering (client <- node <- cluster; pipeline beside
#: them, loading none of them) is broken: (importer, imported module, how).
LAYERING_EXCEPTIONS = {
    ("pipeline/rules.py", "roost.client.clustermap", "in a function"),
    ("pipeline/rules.py", "roost.client.ring", "in a function"),
    ("pipeline/sink.py", "roost.client.library", "in a function"),
    ("pipeline/sink.py", "roost.client.wire", "in a function"),
    ("pipeline/source.py", "roost.client.library", "in a function"),
    ("cluster/cli.py", "roost.pipeline", "when loaded"),
}
#: What each folder may import when it is loaded, besides itself.
BELOW = {"client": set(), "node": {"client"}, "cluster": {"client", "node"}, "pipeline": set()}


def _imports(path: Path) -> set[tuple[str, str]]:
    """The ``roost.*`` modules ``path`` imports, each with how: when loaded, in a function, or
    for the type checker."""
    tree = ast.parse(path.read_text())
    typing_only = {id(n) for node in ast.walk(tree) if isinstance(node, ast.If) and "TYPE_CHECKING" in
                   ast.unparse(node.test) for n in ast.walk(node)}  # fmt: skip
    loaded = {id(n) for n in tree.body} | {id(n) for node in tree.body if isinstance(node, ast.Try)
                                           for n in ast.walk(node)}  # fmt: skip
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("roost."):
            names = [node.module]
        elif isinstance(node, ast.Import):
            names = [a.name for a in node.names if a.name.startswith("roost.")]
        else:
            continue
        how = "for the type checker" if id(node) in typing_only else "when loaded" if id(node) in loaded \
            else "in a function"  # fmt: skip
        found |= {(name, how) for name in names}
    return found


def test_the_layering_is_as_docs_architecture_says():
    upward = set()
    for folder, below in BELOW.items():
        for path in sorted(Path(ROOT, folder).glob("*.py")):
            for name, how in _imports(path):
                if name.split(".")[1] not in below | {folder}:
                    upward.add((f"{folder}/{path.name}", name, how))
    assert upward == LAYERING_EXCEPTIONS, "update docs/architecture.md's layering (and this list) with the imports"
    text = Path(ROOT, "docs", "architecture.md").read_text()
    for importer, _, _ in LAYERING_EXCEPTIONS:
        assert f"`{importer}`" in text
