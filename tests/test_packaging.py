"""The installed distribution: one ``roost`` namespace at the top of site-packages.

The wheel ``pip install .`` installs is built here from the tracked files, as a clean clone has
them (without network: the build backend comes from the development environment), and
installed into an empty directory; a Python that sees only that directory and the dependencies
imports the client from there."""

from __future__ import annotations

import os
import shutil
import site
import subprocess
import sys
from pathlib import Path

from tests.clusterkit import ROOT


def test_the_wheel_installs_roost_alone_and_it_imports(tmp_path):
    src = tmp_path / "src"  # (a copy: the build writes build/ and *.egg-info beside the sources)
    keep = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True).stdout.split()
    for name in keep:
        (src / name).parent.mkdir(parents=True, exist_ok=True)
        if os.path.islink(os.path.join(ROOT, name)):
            (src / name).symlink_to(os.readlink(os.path.join(ROOT, name)))
        elif os.path.isfile(os.path.join(ROOT, name)):
            shutil.copyfile(os.path.join(ROOT, name), src / name)
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "-w",
                    str(tmp_path / "dist"), str(src)], check=True, capture_output=True, timeout=300)  # fmt: skip
    (wheel,) = (tmp_path / "dist").glob("roost-*.whl")
    target = tmp_path / "site"
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-index", "--target", str(target),
                    str(wheel)], check=True, capture_output=True, timeout=300)  # fmt: skip
    top = sorted(p.name for p in target.iterdir() if p.name != "bin")
    assert top == ["roost", f"{wheel.name.split('-')[0]}-{wheel.name.split('-')[1]}.dist-info"]
    assert not any(Path(target, "roost", name).is_symlink() for name in ("client", "node", "cluster"))
    shipped = [p.relative_to(target).as_posix() for p in Path(target, "roost").rglob("*.py")]
    # (neither the simulator and its checkers, a package of their own, nor a test module)
    assert not [p for p in shipped if "/sim" in p or "/test" in p or "fuzz" in p], shipped
    assert len(shipped) > 100 and "roost/cluster/member.py" in shipped
    # -S: no site-packages of the development environment (and so none of its .pth files, which
    # map roost to the checkout); the dependencies come from the path we give, after the target.
    deps = os.pathsep.join(site.getsitepackages())
    code = ("import sys; sys.path[:0] = [sys.argv[1], *sys.argv[2].split(':')];"
            "from roost import Client; import roost.asyncio, roost.sync, roost.cluster.cli as cli;"
            "print(Client.__module__, roost.__file__);"
            "import importlib.util as u; print([u.find_spec(m) for m in ('client', 'node', 'cluster')])")  # fmt: skip
    r = subprocess.run([sys.executable, "-S", "-c", code, str(target), deps], cwd=tmp_path, capture_output=True,
                       text=True, timeout=60)  # fmt: skip
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines() == [f"roost.client.library {target}/roost/__init__.py", "[None, None, None]"]
