"""scripts/cluster_state.py --mode partitioned on real member processes, small: the share of the
subscriptions each of 5 members holds, and a killed member that restarts, PULLs and serves."""

from __future__ import annotations

import re
import subprocess
import sys

from tests.clusterkit import ROOT


def test_partitioned_bench_spreads_the_subscriptions_and_a_killed_member_serves_again() -> None:
    r = subprocess.run(
        [sys.executable, "scripts/cluster_state.py", "--mode", "partitioned", "--subs", "4000", "--clients", "40",
         "--topics", "2000", "--set", "suspect_after=0.6", "--set", "down_after=1.5"],
        cwd=ROOT, capture_output=True, text=True, timeout=90,
    )  # fmt: skip
    out = r.stdout
    print(out)
    assert r.returncode == 0, out + r.stderr[-2000:]
    assert "replicated: the members hold 8,000 = 2 x 4,000" in out
    m = re.search(r"held/total per member: .*\(min ([\d.]+), max ([\d.]+); ideal replicas/5 = 0\.40\)", out)
    assert m is not None, out
    assert 0.3 <= float(m.group(1)) <= float(m.group(2)) <= 0.5
    assert re.search(r"^restarted n3 serving again [\d.]+ s after its process started", out, re.M), out
    pulled = re.search(r"per-partition PULL by the restarted member: ([\d,]+) subscriptions from (\d) peers", out)
    assert pulled is not None and int(pulled.group(1).replace(",", "")) > 0, out
    assert re.search(r"^n3 leads its \d+ primaries again", out, re.M), out
