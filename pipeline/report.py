"""The audit's report.md: per run, what was published and what each mode promised and did,
the faults with their gaps, the members' agreement, and the plots."""

from __future__ import annotations

from typing import Any

from roost.pipeline.rules import MODES


def _ms(v: float | None) -> str:
    return "-" if v is None else f"{v * 1000:.1f}"


def _s(v: float | None) -> str:
    return "-" if v is None else f"{v:.3f}"


def render(summary: dict[str, Any]) -> str:
    out: list[str] = ["# Roost audit", ""]
    a = summary["audit"]
    out.append(
        f"{len(summary['runs'])} run(s), Spark master `{a['master']}`, {a['events']} events; "
        f"conversion {a['convert_s']:.1f} s ({a['converted']} converted, {a['reused']} reused from Parquet), "
        f"analysis {a['analyze_s']:.1f} s. Definitions: docs/pipeline.md and pipeline/rules.py."
    )
    out.append("")
    out.append(
        "| run | events | malformed | published (reliable / fire) | lost (violations) | duplicated | "
        "reordered | durable: acked / lost / duplicated / cursor regressions | faults | members agree | "
        "verdict |"
    )
    out.append("|---|---|---|---|---|---|---|---|---|---|---|")
    for r in summary["runs"]:
        pub = r["published"]
        rel = r["modes"]["reliable"]
        lost = sum(m["totals"]["lost"] for m in r["modes"].values())
        dup = sum(m["totals"]["duplicated"] for m in r["modes"].values())
        reord = sum(m["totals"]["reordered"] for m in r["modes"].values())
        agree = {True: "yes", False: "NO", None: "unknown"}[r["agreement"]["agreed"]]
        d = r["durable"]
        dur = (
            f"{d['acknowledged']} / {d['totals']['lost']} / {d['totals']['duplicated']} / "
            f"{d['totals']['cursor_regressions']}"
            if _durable_on(d)
            else "-"
        )
        out.append(
            f"| {r['run']['id']} | {r['input']['events']} | {r['input']['malformed']} | "
            f"{pub['reliable']['messages']} / {pub['fire']['messages']} | {lost} "
            f"({rel['lost_by_class']['violation']}) | {dup} | {reord} | {dur} | {len(r['faults'])} | {agree} | "
            f"{'OK' if r['ok'] else 'FAIL'} |"
        )
    for r in summary["runs"]:
        out += ["", *_run(r)]
    return "\n".join(out) + "\n"


def _durable_on(d: dict[str, Any]) -> bool:
    return bool(d["puts"] or d["subscriptions"])


def _durable(d: dict[str, Any]) -> list[str]:
    """Durable mode: per subscription cursor, what it was owed and got (pipeline/rules.py)."""
    cols = ("expected", "received", "records", "redelivered", "duplicated", "lost", "reordered", "commits",
            "cursor_regressions")  # fmt: skip
    lat, gap = d["latency"], d["longest_gap"]
    out = ["", f"Durable: {d['puts']} puts, {d['acknowledged']} acknowledged, {d['crashes']} subscriber crashes "
           f"before a commit, {d['offset_conflicts']} offsets carrying two messages, {d['phantoms']} records never "
           f"put; put to first record p50 {_ms(lat['p50'])} ms, p99 {_ms(lat['p99'])} ms; longest gap between "
           f"records while puts went on {_s(gap['gap'])} s.", "",
           "| subscription | topic | " + " | ".join(c.replace("_", " ") for c in cols) + " | cursor |",
           "|---|---|" + "---|" * (len(cols) + 1)]  # fmt: skip
    for s in d["subscriptions"]:
        out.append(
            f"| {s['client']}/{s['durable']} | {s['topic']} | "
            + " | ".join(str(s[c]) for c in cols)
            + f" | {'-' if s['committed'] is None else s['committed']} |"
        )
    return out


def _run(r: dict[str, Any]) -> list[str]:
    run, inp = r["run"], r["input"]
    span = f"{run['ended'] - run['started']:.1f} s" if run["started"] and run["ended"] else "?"
    out = [
        f"## {run['id']}",
        "",
        f"`{run['dir']}`: seed {run['seed']}, {span}, members {' '.join(run['members']) or '?'}; "
        f"{inp['events']} events in {inp['files']} files; grace {r['options']['grace']} s, subscriber_timeout "
        f"{r['options']['subscriber_timeout']} s.",
        "",
    ]
    notes = [
        f"{inp[k]} {k.replace('_', ' ')}"
        for k in ("malformed", "duplicate_publishes", "unpaired_fault_ends", "phantom_deliveries", "stray_deliveries")
        if inp[k]
    ]
    if notes:
        out += ["Input: " + ", ".join(notes) + ".", ""]
    for m in inp["malformed_lines"][:20]:
        out.append(f"- `{m['file']}:{m['line']}`: {m['error']}")
    if inp["malformed_lines"]:
        out.append("")
    out += [
        "| mode | published | acked | expected | delivered | missing | lost | duplicated | reordered | "
        "p50 ms | p90 ms | p99 ms | max ms |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for mode in MODES:
        t, lat, pub = r["modes"][mode]["totals"], r["modes"][mode]["latency"], r["published"][mode]
        out.append(
            f"| {mode} | {pub['messages']} | {pub['acknowledged']} | {t['expected']} | {t['delivered']} | "
            f"{t['missing']} | {t['lost']} | {t['duplicated']} | {t['reordered']} | {_ms(lat['p50'])} | "
            f"{_ms(lat['p90'])} | {_ms(lat['p99'])} | {_ms(lat['max'])} |"
        )
    out.append("")
    for mode in MODES:
        classes = [f"{n} {c}" for c, n in r["modes"][mode]["lost_by_class"].items() if n]
        if classes:
            out.append(f"Lost ({mode}): " + "; ".join(classes) + ".")
    if _durable_on(r["durable"]):
        out += _durable(r["durable"])
    v = r["violations"]
    kinds = ", ".join(f"{n} {k}" for k, n in v["by_kind"].items() if n)
    out += ["", f"Violations: {v['total']}" + (f" ({kinds})" if kinds else "") + ".", ""]
    base = run["started"] or 0.0
    if r["faults"]:
        out += [
            "| fault | target | start | length | gap (s) | recover (s) | deliveries |",
            "|---|---|---|---|---|---|---|",
        ]
        for f in r["faults"]:
            length = "not healed" if f["end"] is None else f"{f['end'] - f['start']:.2f} s"
            out.append(
                f"| {f['fault']} | {f['target']} | +{f['start'] - base:.2f} s | {length} | {_s(f['gap'])} | "
                f"{_s(f['recover'])} | {f['deliveries']} |"
            )
        out.append("")
    ag = r["agreement"]
    state = {True: "agree", False: "DISAGREE", None: "unknown (no status events)"}[ag["agreed"]]
    out += [
        f"Members after the last heal: {state}"
        + (f"; no status from {' '.join(ag['missing'])}" if ag["missing"] else "")
        + ".",
        "",
    ]
    for p in r.get("plot_files", []):
        out.append(f"![{p}]({p})")
    return out
