"""`make demo`: a 3-node Roost cluster, a stream through a member's crash.

1. `roost cluster up configs/cluster3.toml --detach` starts n1, n2 and n3.
2. A subscriber (`roost sub`) and a publisher (the client library) both talk
   to n1; the publisher sends `m0..m39`, five a second.
3. After m12, `roost cluster kill n1` (SIGKILL). Both clients fail over to
   another member and the stream goes on: every message once, in order.
4. `roost cluster start n1`: it PULLs the state and `roost status` shows the
   same subscription count on every member; then everything is stopped.

Everything runs as real processes on loopback; the script stops by PID all
it started, also on error. `--single` runs the single-node demo instead.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
ROOST = [sys.executable, "-m", "roost"]
CONFIG = "configs/cluster3.toml"
RUN_DIR = "run/demo"

import trio  # noqa: E402

from roost.client import Client  # noqa: E402
from roost.node.procs import fastpuss_roundtrip, free_udp_port, wait_listening  # noqa: E402

T0 = time.monotonic()


def say(text: str) -> None:
    print(f"[{time.monotonic() - T0:6.2f}s] {text}", flush=True)


def roost(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*ROOST, *args], cwd=ROOT, capture_output=True, text=True, timeout=120)


def status(node: str) -> dict[str, object] | None:
    """One member's status map, or None when it does not answer."""
    r = roost("status", "--node", node, "--json")
    return json.loads(r.stdout) if r.returncode == 0 else None  # type: ignore[no-any-return]


def show_status(node: str) -> dict[str, object] | None:
    """Print one member's view of the cluster; return its status map."""
    st = status(node)
    if st is None:
        say(f"  {node}: no answer")
        return None
    view = ", ".join(f"{m['id']}={m['state']}/{m['subscriptions']}" for m in st["members"])  # type: ignore[attr-defined]
    say(f"  {st['node']} says: {view}   (member=state/subscriptions)")
    return st


async def publish(n: int, kill_after: int) -> int:
    async with Client("127.0.0.1:7401") as c:
        for i in range(n):
            await c.publish("demo", f"m{i}", wait=False)
            if i == kill_after:
                await c.flush(5)
                say(f"publisher: m0..m{i} acknowledged by {c.session.node_id}; killing n1 now")
                r = roost("cluster", "kill", "n1", "--run-dir", RUN_DIR)
                say("  $ roost cluster kill n1  ->  " + r.stdout.strip())
            await trio.sleep(0.2)
        await c.flush(20)
        say(f"publisher: all {n} acknowledged, now connected to {c.session.node_id} "
            f"after {c.session.failovers} failover(s)")  # fmt: skip
        return c.session.failovers


def agree(views: list[dict[str, object] | None]) -> bool:
    """Every member answers, is ready and counts the same subscriptions."""
    ready = [v for v in views if v is not None and v["state"] == "ready"]
    return len(ready) == len(views) and len({v["subscriptions"] for v in ready}) == 1


def cluster_demo() -> int:
    n, kill_after = 40, 12
    up = subprocess.run([*ROOST, "cluster", "up", CONFIG, "--detach", "--run-dir", RUN_DIR], cwd=ROOT,
                        capture_output=True, text=True, timeout=120)  # fmt: skip
    say("$ roost cluster up configs/cluster3.toml --detach")
    for line in up.stdout.splitlines():
        say("  " + line)
    if up.returncode != 0:
        say("cluster did not start: " + up.stderr.strip())
        return 1
    text_sub = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    text_sub.sendto(b"SUB demo.text\n", ("127.0.0.1", 7403))
    say("a FASTPUSS text client subscribes to demo.text at n3 (it stays; every member replicates it)")
    sub = subprocess.Popen([*ROOST, "sub", "demo", "--node", "127.0.0.1:7401", "--count", str(n), "--timeout", "60"],
                           cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)  # fmt: skip
    try:
        assert sub.stderr is not None and sub.stdout is not None
        say("subscriber: " + sub.stderr.readline().strip().removeprefix("roost sub: "))
        received: list[str] = []

        def read() -> None:
            assert sub.stdout is not None
            for line in sub.stdout:
                received.append(line.strip())
                say(f"subscriber got {line.strip()}")

        reader = threading.Thread(target=read, daemon=True)
        reader.start()
        failovers = trio.run(publish, n, kill_after)
        sub.wait(60)
        reader.join(5)
        ok = received == [f"m{i}" for i in range(n)]
        say(f"{'OK' if ok else 'FAILED'}: the subscriber got {len(received)} of {n} messages, "
            f"{'each once and in order' if ok else 'NOT each once in order'}, across the crash of n1")  # fmt: skip
        for port in (7402, 7403):
            show_status(f"127.0.0.1:{port}")
        say("$ roost cluster start n1   (it PULLs the state from a live member)")
        r = roost("cluster", "start", "n1", "--run-dir", RUN_DIR)
        say("  " + (r.stdout.strip() or r.stderr.strip()))
        members = [f"127.0.0.1:{port}" for port in (7401, 7402, 7403)]
        deadline = time.monotonic() + 15
        while not agree([status(m) for m in members]) and time.monotonic() < deadline:
            time.sleep(0.2)  # until every member is ready with the same count, 15 s at most
        same = agree([show_status(m) for m in members])
        say(f"{'OK' if same else 'FAILED'}: every member reports the same subscriptions after the restart")
        return 0 if ok and same and failovers >= 1 and sub.returncode == 0 else 1
    finally:
        text_sub.sendto(b"UNSUB demo.text\n", ("127.0.0.1", 7403))
        text_sub.close()
        if sub.poll() is None:
            sub.kill()
            sub.wait()
        r = roost("cluster", "down", "--run-dir", RUN_DIR)
        say("$ roost cluster down")
        for line in r.stdout.splitlines():
            say("  " + line)


def single_demo() -> int:
    port = free_udp_port()
    node_addr = f"127.0.0.1:{port}"
    os.makedirs(os.path.join(ROOT, "run"), exist_ok=True)
    cfg = os.path.join(ROOT, "run", "demo.toml")
    with open(cfg, "w") as f:
        f.write(f'[node]\nid = "demo"\nclient_addr = "{node_addr}"\n')
    node = subprocess.Popen([*ROOST, "node", "--config", cfg], cwd=ROOT)
    try:
        wait_listening(node, "127.0.0.1", port)
        sub = subprocess.Popen([*ROOST, "sub", "demo.topic", "--node", node_addr, "--count", "10", "--timeout", "20"],
                               cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE)  # fmt: skip
        assert sub.stderr is not None
        say(sub.stderr.readline().decode().strip())
        subprocess.run([*ROOST, "pub", "demo.topic", "hello #{n}", "--node", node_addr, "--count", "10"],
                       cwd=ROOT, timeout=30)  # fmt: skip
        out, _ = sub.communicate(timeout=30)
        for line in out.decode().splitlines():
            say(f"delivered: {line}")
        say(f"text protocol: received {fastpuss_roundtrip('127.0.0.1', port)!r}")
        return 0 if out.decode().splitlines() == [f"hello #{i}" for i in range(10)] else 1
    finally:
        node.send_signal(signal.SIGTERM)
        node.wait(10)


if __name__ == "__main__":
    sys.exit(single_demo() if "--single" in sys.argv else cluster_demo())
