"""scripts/benchnative.py's own logic (its runs compile with mypyc and take a minute: docs/performance.md)."""

from __future__ import annotations

import subprocess
import sys

from scripts.benchnative import summary
from tests.clusterkit import ROOT


def _row(mode: str, rate: float, pub: float, lost: int = 0) -> dict[str, object]:
    return {"mode": mode, "msgs_per_s": rate, "lost": lost, "duplicated": 0,
            "cpu": {"node": 0.1, "publisher": pub, "subscriber": 0.3}}  # fmt: skip


def test_summary_gives_medians_per_build_and_mode_and_the_compiled_ratio():
    runs = {"plain": [_row("fire", 100.0, 0.3), _row("fire", 300.0, 0.2), _row("fire", 200.0, 0.25, lost=2)],
            "compiled": [_row("fire", 150.0, 0.1), _row("fire", 500.0, 0.2), _row("fire", 250.0, 0.15)]}  # fmt: skip
    lines = summary(runs)
    assert "| plain | fire | 3 | 200 | 0.10/0.25/0.30 | 2 | 0 |" in lines
    assert "| compiled | fire | 3 | 250 | 0.10/0.15/0.30 | 0 | 0 |" in lines
    assert lines[-1] == "compiled / plain, fire: 1.250x"


def test_bad_arguments_are_refused_before_anything_is_compiled():
    for args, why in ((["--rounds", "0"], "--rounds 0: must be at least 1"),
                      (["--modules", "wire,nosuch"], "no client/<name>.py for ['nosuch']"),
                      (["--modes", "relaible"], "--modes 'relaible': ['relaible'] not among reliable, fire"),
                      (["--modes", ""], "--modes '': [''] not among")):  # fmt: skip
        out = subprocess.run([sys.executable, "scripts/benchnative.py", *args], cwd=ROOT, capture_output=True,
                             text=True, timeout=60)  # fmt: skip
        assert out.returncode == 2 and why in out.stderr, out.stderr
