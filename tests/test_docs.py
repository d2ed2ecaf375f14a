"""The docs say what the tree holds: docs/architecture.md's module map names every module of the
package's folders and of scripts/, each once, and nothing that is not there."""

from __future__ import annotations

import re
from pathlib import Path

from tests.clusterkit import ROOT

#: The folders whose every module the map lists, one line each (``__init__.py`` aside).
MAPPED = ("client", "node", "cluster", "pipeline", "scripts")


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
