"""`make demo`: a local node, a subscriber and a publisher; prints what was delivered.

Everything runs as real processes (`roost node`, `roost sub`, `roost pub`) on
loopback, and everything this script starts is stopped by PID before it exits.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ROOST = [sys.executable, "-m", "cluster.cli"]
sys.path.insert(0, ROOT)

from node.procs import free_udp_port, wait_listening  # noqa: E402


def main() -> int:
    port = free_udp_port()
    node_addr = f"127.0.0.1:{port}"
    run_dir = os.path.join(ROOT, "run")
    os.makedirs(run_dir, exist_ok=True)
    cfg = os.path.join(run_dir, "demo.toml")
    with open(cfg, "w") as f:
        f.write(f'[node]\nid = "demo"\nclient_addr = "{node_addr}"\n')
    procs: list[subprocess.Popen[bytes]] = []
    try:
        print(f"== starting node 'demo' on udp://{node_addr}", flush=True)
        node = subprocess.Popen([*ROOST, "node", "--config", cfg], cwd=ROOT)
        procs.append(node)
        wait_listening(node, "127.0.0.1", port)
        n = 10
        print(f"== subscriber: roost sub demo.topic --count {n} --mode reliable", flush=True)
        sub = subprocess.Popen(
            [*ROOST, "sub", "demo.topic", "--node", node_addr, "--count", str(n),
             "--mode", "reliable", "--timeout", "20"],
            cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        )  # fmt: skip
        procs.append(sub)
        assert sub.stderr is not None
        print("   " + sub.stderr.readline().decode().strip(), flush=True)  # "subscribed to ..."
        print(f"== publisher: roost pub demo.topic 'hello #{{n}}' --count {n} --mode reliable", flush=True)
        pub = subprocess.run(
            [*ROOST, "pub", "demo.topic", "hello #{n}", "--node", node_addr, "--count", str(n)],
            cwd=ROOT, timeout=30,
        )  # fmt: skip
        out, err = sub.communicate(timeout=30)
        print("== delivered to the subscriber:")
        for line in out.decode().splitlines():
            print(f"   {line}")
        print("== text protocol (FASTPUSS): SUB from one socket, PUB from another")
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as a, \
                socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as b:  # fmt: skip
            a.settimeout(2)
            a.sendto(b"SUB t1\n", ("127.0.0.1", port))
            time.sleep(0.1)
            b.sendto(b"PUB t1\nhello world  ", ("127.0.0.1", port))
            print(f"   received {a.recv(1000)!r}")
        expected = [f"hello #{i}" for i in range(n)]
        ok = pub.returncode == 0 and sub.returncode == 0 and out.decode().splitlines() == expected
        print(f"== {'OK' if ok else 'FAILED'}: {len(out.splitlines())} of {n} messages delivered in order"
              if ok else f"== FAILED: pub rc={pub.returncode} sub rc={sub.returncode} {err.decode()}")
        return 0 if ok else 1
    finally:
        for p in procs:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        for p in procs:
            try:
                p.wait(10)
            except subprocess.TimeoutExpired:
                p.kill()
        print("== stopped everything the demo started", flush=True)


if __name__ == "__main__":
    sys.exit(main())
