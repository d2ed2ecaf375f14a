"""The structure docs/architecture.md promises, checked over the whole tree.

* Components, not mixins: a class's methods live in one file (the product's and the simulator's).
  Inheriting from a pure interface (a base whose every method is abstract) adds no method, so it
  is allowed; a base with a method of its own in another file is a class cut across files.
* No production function or method is ever reassigned, tests and simulator included: the
  simulator observes the cores through ``Trace`` actions and breaks them through their
  configuration (``breaks``), tests inject through constructors. A reassignment would make the
  simulator run something other than what ships.
"""

from __future__ import annotations

import ast
import importlib
import inspect
import pkgutil
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PRODUCT = ("client", "node", "cluster", "pipeline")
TREE = (*PRODUCT, "sim", "scripts", "tests")


def _modules() -> list[str]:
    """The product's modules and the simulator's (which runs the product's cores)."""
    names = [f"roost.{n}" for n in ("asyncio", "sync", "trio")]
    for pkg in PRODUCT:
        path = [str(ROOT / pkg)]
        names += [f"roost.{pkg}.{m.name}" for m in pkgutil.iter_modules(path)]
    return names + [f"sim.{m.name}" for m in pkgutil.iter_modules([str(ROOT / "sim")])]


def _concrete(cls: type) -> list[str]:
    """The methods ``cls`` defines itself and does not leave abstract."""
    return [
        n
        for n, v in vars(cls).items()
        if (inspect.isfunction(v) or isinstance(v, property | staticmethod | classmethod))
        and not getattr(v, "__isabstractmethod__", False)
    ]


def files_of(cls: type, prefixes: tuple[str, ...] = ("roost.", "sim.")) -> set[str]:
    """The files that hold a method of ``cls`` (its own or a base's, abstract ones aside)."""
    return {Path(inspect.getfile(b)).name for b in cls.__mro__ if b.__module__.startswith(prefixes) and _concrete(b)}


def _spans() -> list[str]:
    found = []
    for name in _modules():
        module = importlib.import_module(name)
        for cname, cls in vars(module).items():
            if not inspect.isclass(cls) or cls.__module__ != name or issubclass(cls, BaseException):
                continue
            files = files_of(cls)
            if len(files) > 1:
                found.append(f"{name}.{cname}: {sorted(files)}")
    return found


def test_no_class_has_methods_in_more_than_one_file():
    assert _spans() == []


def test_the_span_check_sees_a_mixin():
    """(The check can fail: a class whose base has methods in another file spans two files; one
    whose base is a pure interface does not.)"""
    import abc

    from roost.node import mailbox

    class Mixed(mailbox.Mailbox):
        def more(self) -> None: ...

    class Interface(abc.ABC):
        @abc.abstractmethod
        def more(self) -> None: ...

    class Implements(Interface):
        def more(self) -> None: ...

    assert files_of(Mixed, ("roost.", "tests.")) == {"mailbox.py", "test_structure.py"}
    assert files_of(Implements, ("roost.", "tests.")) == {"test_structure.py"}


def _defined_names() -> tuple[set[str], set[str]]:
    """Every function and method name of the product, and its class names."""
    functions: set[str] = set()
    classes: set[str] = set()
    for pkg in PRODUCT:
        for f in (ROOT / pkg).rglob("*.py"):
            for n in ast.walk(ast.parse(f.read_text())):
                if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef):
                    functions.add(n.name)
                elif isinstance(n, ast.ClassDef):
                    classes.add(n.name)
    return functions - {"__init__"}, classes


def _nested_defs(tree: ast.AST) -> set[str]:
    """Functions defined inside another function: the replacements a patch installs."""
    nested = set()
    for outer in ast.walk(tree):
        if isinstance(outer, ast.FunctionDef | ast.AsyncFunctionDef):
            for n in ast.walk(outer):
                if n is not outer and isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef):
                    nested.add(n.name)
    return nested


def reassignments(source: str, functions: set[str], classes: set[str]) -> list[str]:
    """The statements of ``source`` that replace a product function or method: an attribute
    named like one assigned a lambda, a function made for the purpose, or on a class; and
    ``setattr`` / ``monkeypatch.setattr`` naming one."""
    tree = ast.parse(source)
    nested = _nested_defs(tree)
    hits = []
    for n in ast.walk(tree):
        if isinstance(n, ast.Assign):
            for target in n.targets:
                for t in target.elts if isinstance(target, ast.Tuple) else [target]:
                    if not isinstance(t, ast.Attribute) or t.attr not in functions:
                        continue
                    v = n.value
                    if (
                        isinstance(v, ast.Lambda)
                        or (isinstance(v, ast.Name) and v.id in nested)
                        or (isinstance(t.value, ast.Name) and t.value.id in classes)
                    ):
                        hits.append(f"{n.lineno}: {ast.unparse(t)} = ...")
        elif isinstance(n, ast.Call) and ast.unparse(n.func).endswith("setattr") and n.args:
            strings = [a.value for a in n.args[:2] if isinstance(a, ast.Constant) and isinstance(a.value, str)]
            if any(s.rsplit(".", 1)[-1] in functions for s in strings):
                hits.append(f"{n.lineno}: {ast.unparse(n)[:80]}")
    return hits


def test_no_production_function_is_reassigned_anywhere():
    functions, classes = _defined_names()
    found = []
    for top in TREE:
        for f in sorted((ROOT / top).rglob("*.py")):
            found += [f"{f.relative_to(ROOT)}:{h}" for h in reassignments(f.read_text(), functions, classes)]
    assert found == []


@pytest.mark.parametrize(
    "patch",
    [
        "core._run_log = watched",  # (watched: defined in the function below)
        "Registers._merge = x.y",
        "c._turn = lambda: None",
        "monkeypatch.setattr(BrokerCore, '_on_binary', lax)",
        "monkeypatch.setattr('roost.client.clientbase.send_now', noted)",
    ],
)
def test_the_reassignment_search_finds_a_patch(patch):
    source = f"def test():\n    def watched(): ...\n    {patch}\n"
    functions = {"_run_log", "_merge", "_turn", "_on_binary", "send_now"}
    assert len(reassignments(source, functions, {"Registers", "BrokerCore"})) == 1


def test_the_reassignment_search_leaves_data_alone():
    source = "def f(self, text):\n    self.text = text\n    self.ready = True\n    monkeypatch.setattr(m, 'MAX', 4)\n"
    assert reassignments(source, {"text", "ready"}, set()) == []
