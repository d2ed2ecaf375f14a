"""What compiling the client's sans-IO cores with mypyc does to W1: a measured answer to "would
compiling lift the ceiling", kept as a command rather than a claim.

It copies the checkout into a temporary directory, compiles the listed modules there with mypyc
(from the mypy we already depend on; it needs a C compiler and Python's headers), checks that the
copy imports the compiled modules, and then runs ``scripts/bench.py --workloads W1`` alternately
in the plain checkout and in the compiled copy, ``--rounds`` times each, so both see the same
machine. It prints each run and the medians (msgs/s and each process's CPU seconds).

Only synchronous modules are compiled by default: the cores that decode, route, sequence and
pack. The async modules (client/api.py, client/library.py) compile after small changes but the
compiled client aborted in our tests ("fatal: out of memory" inside a trio task), and mypyc's
native classes refuse attribute assignment from outside, which several tests rely on.

    python scripts/benchnative.py                 # 5 rounds, reliable and fire
    python scripts/benchnative.py --rounds 3 --modes fire
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from scripts.benchsystems import MODES  # noqa: E402

TREE = ("client", "node", "cluster", "pipeline", "roost", "scripts", "pyproject.toml")
MODULES = ("wire", "decoding", "receive", "session", "router", "publisher", "udp")
RUN_TIMEOUT = 600  # seconds for one bench.py run (W1 takes ~5)


def compiled_copy(where: Path, modules: list[str]) -> Path:
    """A copy of the checkout under ``where`` with ``modules`` (of roost.client) compiled."""
    copy = where / "tree"
    copy.mkdir()
    for name in TREE:
        src = ROOT / name
        if src.is_dir():
            shutil.copytree(src, copy / name, symlinks=True, ignore=shutil.ignore_patterns("__pycache__", "*.so"))
        else:
            shutil.copy2(src, copy / name)
    paths = [f"roost/client/{m}.py" for m in modules]
    build = subprocess.run([sys.executable, "-m", "mypyc", *paths], cwd=copy, capture_output=True, text=True)
    if build.returncode != 0:
        sys.exit(f"mypyc failed (exit {build.returncode}):\n{build.stdout[-3000:]}{build.stderr[-3000:]}")
    plain = [f for f in imported(copy, modules) if not f.endswith(".so")]
    if plain:
        sys.exit(f"the copy still imports source modules: {plain}")
    return copy


def imported(tree: Path, modules: list[str]) -> list[str]:
    """The files ``tree`` imports ``modules`` (of roost.client) from, as bench.py's processes would."""
    probe = "import importlib, sys\nfor m in sys.argv[1:]: print(importlib.import_module('roost.client.' + m).__file__)"
    out = subprocess.run([sys.executable, "-c", probe, *modules], cwd=tree, env=_env(tree),
                         capture_output=True, text=True)  # fmt: skip
    if out.returncode != 0:
        sys.exit(f"importing {modules} from {tree} failed:\n{out.stderr[-3000:]}")
    return out.stdout.split()


def _env(tree: Path) -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(tree)}


def run_w1(tree: Path, modes: str) -> list[dict[str, Any]]:
    """One ``bench.py --workloads W1`` run from ``tree``: its JSON rows. It runs in a session of
    its own, so that a run that hangs is stopped with its node, publisher and subscriber."""
    bench = subprocess.Popen([sys.executable, str(tree / "scripts" / "bench.py"), "--workloads", "W1", "--modes",
                              modes, "--json"], cwd=tree, env=_env(tree), stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True, start_new_session=True)  # fmt: skip
    try:
        stdout, stderr = bench.communicate(timeout=RUN_TIMEOUT)
    except subprocess.TimeoutExpired:
        os.killpg(bench.pid, signal.SIGKILL)
        bench.communicate()
        sys.exit(f"bench.py in {tree} ran over {RUN_TIMEOUT} s: stopped with its processes")
    rows = [json.loads(line) for line in stdout.splitlines() if line.startswith("{")]
    if bench.returncode != 0 or not rows:
        sys.exit(f"bench.py in {tree} failed (exit {bench.returncode}):\n{stderr[-2000:]}")
    return rows


def summary(runs: dict[str, list[dict[str, Any]]]) -> list[str]:
    """Median msgs/s and CPU seconds per (build, mode), and compiled/plain per mode."""
    lines = [
        "| build | mode | runs | median msgs/s | median cpu s node/pub/sub | lost | dup |",
        "|---|---|---|---|---|---|---|",
    ]
    medians: dict[tuple[str, str], float] = {}
    for build, rows in runs.items():
        for mode in sorted({r["mode"] for r in rows}):
            mine = [r for r in rows if r["mode"] == mode]
            rate = statistics.median(r["msgs_per_s"] for r in mine)
            medians[build, mode] = rate
            cpu = "/".join(
                f"{statistics.median(r['cpu'][p] for r in mine):.2f}" for p in ("node", "publisher", "subscriber")
            )
            lines.append(f"| {build} | {mode} | {len(mine)} | {rate:,.0f} | {cpu} | "
                         f"{sum(r['lost'] for r in mine)} | {sum(r['duplicated'] for r in mine)} |")  # fmt: skip
    for (build, mode), rate in sorted(medians.items()):
        base = medians.get(("plain", mode))
        if build == "compiled" and base:
            lines.append(f"compiled / plain, {mode}: {rate / base:.3f}x")
    return lines


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=5, help="W1 runs of each build, alternating (default 5)")
    ap.add_argument("--modes", default="reliable,fire", help="bench.py --modes (default reliable,fire)")
    ap.add_argument(
        "--modules", default=",".join(MODULES), help=f"roost.client modules to compile (default {','.join(MODULES)})"
    )
    args = ap.parse_args()
    if args.rounds < 1:
        ap.error(f"--rounds {args.rounds}: must be at least 1")
    bad = [m for m in args.modes.split(",") if m not in MODES["roost"]]
    if bad:
        ap.error(f"--modes {args.modes!r}: {bad} not among {', '.join(MODES['roost'])}")
    modules = [m for m in args.modules.split(",") if m]
    unknown = [m for m in modules if not (ROOT / "client" / f"{m}.py").is_file()]
    if unknown or not modules:
        ap.error(f"--modules: no client/<name>.py for {unknown or 'an empty list'}")
    compiled = [f for f in imported(ROOT, modules) if not f.endswith(".py")]
    if compiled:
        sys.exit(f"the checkout imports compiled modules (remove them, or the plain runs are not plain): {compiled}")
    with tempfile.TemporaryDirectory(prefix="roost-native-") as tmp:
        copy = compiled_copy(Path(tmp), modules)
        print(f"# compiled in {copy}: roost.client.{{{','.join(modules)}}}", flush=True)
        runs: dict[str, list[dict[str, Any]]] = {"plain": [], "compiled": []}
        for i in range(args.rounds):
            for build, tree in (("plain", ROOT), ("compiled", copy)):
                rows = run_w1(tree, args.modes)
                runs[build] += rows
                for r in rows:
                    rate = f"{r['msgs_per_s']:,.0f} msgs/s"
                    print(f"round {i + 1} {build} {r['mode']}: {rate}, cpu {r['cpu']}", flush=True)
        print("\n".join(summary(runs)))


if __name__ == "__main__":
    main()
