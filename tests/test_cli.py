"""The client command line: output formats, tags, binary and bad input, request/reply, help and
refused values. The parser's checks run in this process; the rest runs `roost` processes
against a node process."""

from __future__ import annotations

import argparse
import base64
import json
import re
import subprocess
import sys
import time
from typing import Any

import pytest

from roost import __version__
from roost.cluster.cli import build_parser, main
from tests.clusterkit import ROOST, ROOT, Node, roost, start_sub, sub_lines


@pytest.fixture(scope="module")
def node(tmp_path_factory):
    n = Node(tmp_path_factory.mktemp("cli"))
    yield n
    n.stop()


# ------------------------------------------------------------ in this process: the parser


def parsers(parser: argparse.ArgumentParser, path: str = "roost"):
    yield path, parser
    for a in parser._actions:
        if isinstance(a, argparse._SubParsersAction):
            for name, sub in a.choices.items():
                yield from parsers(sub, f"{path} {name}")


def test_every_argument_has_help_text_and_every_flag_its_default():
    seen = 0
    for path, parser in parsers(build_parser()):
        flat = " ".join(parser.format_help().split())
        assert "(default: None)" not in flat and "(default: False)" not in flat, path
        for a in parser._actions:
            if isinstance(a, argparse._SubParsersAction | argparse._HelpAction | argparse._VersionAction):
                continue
            assert a.help, f"{path} {a.option_strings or a.dest} has no help text"
            seen += 1
            if a.option_strings and not a.required:
                text = " ".join(a.help.split()) % {"default": a.default}
                assert text in flat, f"{path} {a.option_strings}"
                shown = text + flat.split(text, 1)[1].split(" -", 1)[0]  # (up to the next flag)
                assert "default" in shown and shown.count("(default:") <= 1, f"{path} {a.option_strings}: {shown}"
    assert seen > 60
    flat = " ".join(build_parser()._subparsers._group_actions[0].choices["pub"].format_help().split())  # type: ignore
    assert "within S seconds of the last (default: 30.0)" in flat
    assert "(default: $ROOST_NODES or 127.0.0.1:7400)" in flat


def test_version(capsys):
    with pytest.raises(SystemExit) as e:
        main(["--version"])
    assert e.value.code == 0 and capsys.readouterr().out == f"roost {__version__}\n"


@pytest.mark.parametrize(("argv", "why"), [
    (["pub", "t", "x", "--timeout", "-1"], "--timeout: must be a number of seconds > 0, not '-1'"),
    (["sub", "t", "--timeout", "0"], "--timeout: must be a number of seconds > 0"),
    (["sub", "t", "--timeout", "soon"], "expected a number of seconds, not 'soon'"),
    (["pub", "t", "x", "--count", "-1"], "--count: must be >= 0, not -1"),
    (["sub", "t", "--count", "0"], "--count: must be >= 1, not 0"),
    (["get", "t", "--durable", "d", "--count", "two"], "expected a whole number, not 'two'"),
    (["pub", "t", "x", "--tag", "novalue"], "a tag is NAME=VALUE, not 'novalue'"),
    (["pub", "t", "x", "--tag", "=v"], "a tag is NAME=VALUE, not '=v'"),
    (["pub", "t", "x", "--node", "h:port"], "--node: 'h:port' has no valid port"),
    (["status", "--node", "h:1,,"], "empty node address"),
    (["sub", "t", "--json", "--raw"], "not allowed with argument"),
    (["reply", "t"], "one of the arguments --echo --command is required"),
    (["request", "t", "x", "--timeout", "nan"], "must be a number of seconds > 0"),
])  # fmt: skip
def test_bad_values_are_refused_before_anything_is_sent(argv, why, capsys):
    with pytest.raises(SystemExit) as e:
        build_parser().parse_args(argv)
    assert e.value.code == 2 and why in capsys.readouterr().err


def test_pub_refuses_a_message_with_file_input_and_a_missing_file(tmp_path):
    r = roost("pub", "t", "x", "--binary", "--node", "127.0.0.1:9")
    assert r.returncode == 2 and "give MESSAGE or --file/--binary input, not both" in r.stderr
    r = roost("pub", "t", "--file", str(tmp_path / "nope"), "--node", "127.0.0.1:9")
    assert r.returncode == 2 and "cannot read --file" in r.stderr and "No such file" in r.stderr


# ------------------------------------------------------------ against a node process


def test_localhost_node_reliable_exchange(node):
    where = f"localhost:{node.port}"
    sub = start_sub(where, "cli.local", 10)
    r = roost("pub", "cli.local", "m{n}", "--count", "10", "--node", where)
    assert r.returncode == 0, r.stderr
    assert sub_lines(sub) == [f"m{i}" for i in range(10)]
    assert "roost pub: 10 published, 10 acknowledged, in " in r.stderr and "msgs/s" in r.stderr


def test_sub_verbose_json_and_raw_with_tags_and_binary(node, tmp_path):
    blob = bytes(range(256))
    (tmp_path / "blob").write_bytes(blob)
    subs = {fmt: start_sub(node.addr, "cli.fmt", 2, extra=[fmt]) for fmt in ("-v", "--json", "--raw")}
    r = roost("pub", "cli.fmt", "hello", "--key", "k1", "--tag", "kind=order", "--tag", "n=1", "--node", node.addr)
    assert r.returncode == 0, r.stderr
    r = roost("pub", "cli.fmt", "--binary", "--file", str(tmp_path / "blob"), "--node", node.addr, "-q")
    assert (r.returncode, r.stderr) == (0, "")
    verbose = subs["-v"].communicate(timeout=60)[0]
    assert verbose.startswith(b"cli.fmt key=k1 seq=1 tags=kind=order,n=1 hello\ncli.fmt key=- seq=2 tags=- ")
    assert verbose.endswith(blob + b"\n")
    first, second = (json.loads(line) for line in subs["--json"].communicate(timeout=60)[0].splitlines())
    assert first == {"topic": "cli.fmt", "key": "k1", "tags": {"kind": "order", "n": "1"}, "sequence": 1,
                     "payload": "hello"}  # fmt: skip
    assert "payload" not in second and base64.b64decode(second["payload_base64"]) == blob
    assert subs["--raw"].communicate(timeout=60)[0] == b"hello" + blob
    assert all(p.returncode == 0 for p in subs.values())


def test_pub_reports_undecodable_lines_and_publishes_the_rest(node):
    sub = start_sub(node.addr, "cli.bad", 3)
    p = subprocess.run([*ROOST, "pub", "cli.bad", "--node", node.addr], cwd=ROOT, capture_output=True,
                       input=b"one\ntw\xffo\nthree\n" + b"x" * 1_100_000 + b"\nfour\n", timeout=60)  # fmt: skip
    err = p.stderr.decode()
    assert p.returncode == 1, err
    assert "line 2: not UTF-8 at byte 2 (--binary sends raw bytes); skipped" in err
    assert "line 4: payload of 1,100,000 bytes is over max_payload (1,048,576 bytes" in err
    assert "3 published, 3 acknowledged" in err and "2 input line(s) skipped" in err
    assert sub_lines(sub) == ["one", "three", "four"]


def test_request_and_reply_echo(node):
    replier = subprocess.Popen([*ROOST, "reply", "cli.svc", "--echo", "--count", "1", "--node", node.addr],
                               cwd=ROOT, stderr=subprocess.PIPE, text=True)  # fmt: skip
    try:
        assert replier.stderr is not None and "answering requests on cli.svc" in replier.stderr.readline()
        # A message with the request tags but no usable reply topic (anyone may send one) is ignored.
        r = roost("pub", "cli.svc", "evil", "--tag", "roost.reply_to=", "--tag", "roost.request=1", "--node", node.addr)
        assert r.returncode == 0, r.stderr
        assert "asks for no answer; ignored" in replier.stderr.readline()
        r = roost("request", "cli.svc", "ping?", "--node", node.addr)
        assert (r.returncode, r.stdout) == (0, "ping?\n"), r.stderr
        assert replier.wait(30) == 0
    finally:
        if replier.poll() is None:
            replier.kill()
    r = roost("request", "cli.nobody", "hello", "--node", node.addr, "--timeout", "0.3")
    assert r.returncode == 1 and "no reply to the request on 'cli.nobody' within 0.3 s" in r.stderr


def test_reply_command_output_and_failure(node):
    cmd = 'read x; if [ "$x" = fail ]; then echo broken >&2; exit 3; fi; echo "got $x"'
    replier = subprocess.Popen([*ROOST, "reply", "cli.cmd", "--command", cmd, "--count", "1", "--node", node.addr],
                               cwd=ROOT, stderr=subprocess.PIPE, text=True)  # fmt: skip
    try:
        assert replier.stderr is not None and "answering requests on cli.cmd" in replier.stderr.readline()
        r = roost("request", "cli.cmd", "fail", "--node", node.addr, "--timeout", "1")
        assert r.returncode == 1 and r.stdout == ""  # (a failed command answers nothing)
        assert "the command exited with 3; no answer: broken" in replier.stderr.readline()
        r = roost("request", "cli.cmd", "this", "--node", node.addr)
        assert (r.returncode, r.stdout) == (0, "got this\n"), r.stderr  # (the output's own newline, not two)
        assert replier.wait(30) == 0
    finally:
        if replier.poll() is None:
            replier.kill()


@pytest.mark.slow
def test_cluster_up_against_busy_ports_exits_at_once_naming_the_member(tmp_path):
    from roost.cluster.launcher import write_local_config

    config = tmp_path / "c.toml"
    write_local_config(config, 2)
    hasty = roost("cluster", "up", str(config), "--detach", "--run-dir", str(tmp_path / "h"), "--ready-timeout", "0.05")
    assert hasty.returncode == 1 and "was not ready within 0.05 s" in hasty.stderr, hasty.stderr
    assert "stopped the 2 member(s) this up started" in hasty.stderr
    first = roost("cluster", "up", str(config), "--detach", "--run-dir", str(tmp_path / "a"), timeout=90)
    try:
        assert first.returncode == 0, first.stderr
        assert first.stdout.count(" ready: clients udp://") == 2
        started = time.monotonic()
        second = roost("cluster", "up", str(config), "--detach", "--run-dir", str(tmp_path / "b"), timeout=90)
        took = time.monotonic() - started
        assert second.returncode == 1 and took < 5, (took, second.stderr)
        assert "ready" not in second.stdout
        assert "exited with status 1 before it was ready" in second.stderr and "cannot bind" in second.stderr
        assert "stopped the 2 member(s) this up started" in second.stderr
        # kill without --run-dir finds the cluster that runs (a), not the one that failed (b)
        kill = roost("cluster", "kill", "n2")
        assert kill.returncode == 0 and "killed n2" in kill.stdout, kill.stderr
        # and so does start: a runs without n2 (b, used later, runs nothing)
        start = roost("cluster", "start", "n2", timeout=90)
        assert start.returncode == 0 and "started n2" in start.stdout, start.stderr
        assert (tmp_path / "a" / "n2.pid").exists() and not (tmp_path / "b" / "n2.pid").exists()
        again = roost("cluster", "start", "n2")
        assert again.returncode == 1 and f"n2 is already running (pid {(tmp_path / 'a' / 'n2.pid').read_text()}, " \
            f"run dir {tmp_path / 'a'})" in again.stderr, again.stderr  # fmt: skip
    finally:
        down = roost("cluster", "down", "--run-dir", str(tmp_path / "a"))
        assert down.returncode == 0, down.stderr


def member_stand_in(launcher: Any, member: str) -> subprocess.Popen[bytes]:
    """A process the launcher takes for ``member`` (``--id member`` in its command line)."""
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)", "--id", member])
    (launcher.run_dir / f"{member}.pid").write_text(str(proc.pid))
    return proc


def test_down_and_start_lookup_need_no_secret(tmp_path, monkeypatch, capsys):
    """A cluster whose secret came from $ROOST_CLUSTER_SECRET stops from a shell without it."""
    from roost.cluster.launcher import Launcher, find_run_dir, remember, write_local_config

    config = tmp_path / "c.toml"
    write_local_config(config, 2)
    config.write_text(config.read_text().replace('secret = "local-secret-0123456789"', ""))
    monkeypatch.delenv("ROOST_CLUSTER_SECRET", raising=False)
    launcher = Launcher(str(tmp_path / "run"))
    launcher._save_config_path(str(config))
    remember(launcher.run_dir)
    proc = member_stand_in(launcher, "n1")
    try:
        assert find_run_dir("n2", running=False) == str(launcher.run_dir.resolve())
        assert launcher.down() == 0 and proc.wait(20) == -15
        assert f"stopped n1 (pid {proc.pid})" in capsys.readouterr().out
    finally:
        proc.kill()
        proc.wait(10)


def test_start_without_run_dir_takes_the_running_cluster_else_the_last_one_used(tmp_path):
    """Which run directory ``cluster start ID`` means, with stand-in member processes (the
    launcher knows a member by ``--id ID`` in the process's command line)."""
    from roost.cluster.launcher import DEFAULT_RUN_DIR, Launcher, find_run_dir, remember, write_local_config
    from roost.node.config import ConfigError

    dirs = {}
    for name in ("a", "b"):  # (b is used last)
        config = tmp_path / f"{name}.toml"
        write_local_config(config, 2)
        dirs[name] = Launcher(str(tmp_path / name))
        dirs[name]._save_config_path(str(config))
        remember(dirs[name].run_dir)
    a, b = (str(dirs[n].run_dir.resolve()) for n in "ab")
    assert find_run_dir("n1", running=False) == b  # (nothing runs: the last one used)
    procs: list[subprocess.Popen[bytes]] = []

    def stand_in(launcher: Launcher, member: str) -> int:
        procs.append(member_stand_in(launcher, member))
        return procs[-1].pid

    try:
        stand_in(dirs["a"], "n2")
        assert find_run_dir("n1", running=False) == a  # (a runs without n1; its stand-in may be in execve)
        assert find_run_dir("n2", running=True) == a
        pid = stand_in(dirs["a"], "n1")
        with pytest.raises(RuntimeError, match=re.escape(f"n1 is already running (pid {pid}, run dir {a})")):
            find_run_dir("n1", running=False)
        (dirs["a"].run_dir / "n1.pid").unlink()
        (tmp_path / "a.toml").write_text("[cluster\n")  # (a running cluster's config that no longer loads)
        with pytest.raises(ConfigError, match=r"a\.toml"):
            find_run_dir("n1", running=False)
        for p in procs:
            p.kill()
            p.wait(10)
        (tmp_path / "b.toml").unlink()  # (a stopped cluster whose config is gone is passed over)
        write_local_config(tmp_path / "a.toml", 2)
        assert find_run_dir("n1", running=False) == a
        # join (no member: the running cluster of its --config): b runs, a does not
        stand_in(dirs["b"], "n1")
        assert find_run_dir(None, running=True, config=str(tmp_path / "b.toml")) == b
        assert find_run_dir(None, running=True, config=str(tmp_path / "a.toml")) == DEFAULT_RUN_DIR
    finally:
        for p in procs:
            p.kill()
            p.wait(10)


def test_json_log_lines_carry_the_same_fields():
    import io

    from roost.node.logs import EventLog

    out = io.StringIO()
    log = EventLog("j1", "info", out, fmt="json")
    log("info", "client_new", client="ab", addr="127.0.0.1:1", subs=3, gone=None)
    log("debug", "hidden")
    (line,) = out.getvalue().splitlines()
    doc = json.loads(line)
    assert doc.pop("ts").endswith("Z")
    assert doc == {
        "level": "info",
        "node": "j1",
        "event": "client_new",
        "client": "ab",
        "addr": "127.0.0.1:1",
        "subs": 3,
    }


def test_roost_bench_runs_the_checkouts_script_with_its_own_options():
    """Everything after ``bench`` is the script's (its options start with --)."""
    r = roost("bench", "--workloads", "W0")
    assert r.returncode != 0 and "unknown workload 'W0'" in r.stderr
    r = roost("bench", "--help")
    assert r.returncode == 0 and "--peers" in r.stdout
