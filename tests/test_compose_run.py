"""docker-compose.yml's services run as local processes and form a cluster.

No container engine runs here, so each service becomes what its container would be: a network
namespace of its own (scripts/netns.py, 127.77.0.N) whose hosts file names the other services,
as Compose's DNS does; a working directory of its own (``working_dir``, with a fresh directory
where each named volume is mounted); the service's ``environment`` interpolated as Compose would
(``${ROOST_CLUSTER_SECRET:?...}`` from the caller's environment); and the service's exact
``command`` (the image's entrypoint is ``roost``), with only the bind-mounted paths (the config)
read from where ``volumes`` mounts them from. Each service's ``healthcheck`` runs in its
namespace as written. Needs root (namespaces), as tests/test_faults.py.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from scripts import netns
from tests.clusterkit import ROOT
from tests.polling import wait_until

SECRET = "compose-run-secret-0123456789abcdef"
CLIENT_HOST = "client"
_VAR = re.compile(r"\$\{(\w+)(?::\?([^}]*))?\}")


def interpolate(value: str, env: dict[str, str]) -> str:
    """Compose's ``${VAR}`` and ``${VAR:?error}`` (what these files use)."""

    def one(m: re.Match[str]) -> str:
        if m.group(1) not in env:
            raise AssertionError(f"${{{m.group(1)}}} is required: {m.group(2)}")
        return env[m.group(1)]

    return _VAR.sub(one, value)


def service_env(service: dict[str, Any], env: dict[str, str]) -> dict[str, str]:
    raw = service.get("environment") or {}
    items = raw.items() if isinstance(raw, dict) else (e.split("=", 1) for e in raw)
    return {k: interpolate(str(v), env) for k, v in items}


def local_command(service: dict[str, Any]) -> list[str]:
    """The service's command as the container runs it (entrypoint ``roost``), with bind-mounted
    paths read from their source in the repository."""
    mounts = {}
    for v in service.get("volumes", []):
        source, target = v.split(":")[:2]
        if source.startswith("./"):
            mounts[target] = os.path.join(ROOT, source[2:])
    return [sys.executable, "-m", "roost", *(mounts.get(str(a), str(a)) for a in service["command"])]


def healthcheck(service: dict[str, Any]) -> list[str]:
    test = service["healthcheck"]["test"]
    assert test[0] == "CMD" and test[1] == "python", f"healthcheck: expected [CMD, python, ...]: {test}"
    return [sys.executable, *test[2:]]


@pytest.fixture
def hosts() -> Any:
    why = netns.why_unusable("tests/test_compose_run.py")
    if why is not None:
        pytest.fail(why)
    yield netns
    assert netns.down() == []


@pytest.mark.slow
def test_compose_services_form_a_cluster_as_local_processes(tmp_path: Path, hosts: Any) -> None:
    with open(os.path.join(ROOT, "docker-compose.yml"), encoding="utf-8") as f:
        services: dict[str, Any] = yaml.safe_load(f)["services"]
    names = [*services, CLIENT_HOST]
    spaces = hosts.up(len(names))
    ns = dict(zip(names, spaces, strict=True))
    for space in spaces:
        hosts.set_hosts(space, {name: hosts.addr_of(ns[name]) for name in names})
    with pytest.raises(AssertionError, match=r"ROOST_CLUSTER_SECRET\} is required"):
        service_env(services["n1"], {})  # (no secret, no cluster: Compose refuses to start)
    procs: dict[str, subprocess.Popen[bytes]] = {}
    try:
        for name, service in services.items():
            work = tmp_path / name  # working_dir; its named volumes are fresh directories in it
            for v in service["volumes"]:
                source, target = v.split(":")[:2]
                if not source.startswith("./"):
                    (work / os.path.relpath(target, service["working_dir"])).mkdir(parents=True)
            env = {**os.environ, **service_env(service, {"ROOST_CLUSTER_SECRET": SECRET})}
            env.pop("ROOST_NODES", None)
            with open(tmp_path / f"{name}.log", "wb") as log:
                procs[name] = subprocess.Popen([*hosts.exec_prefix(ns[name]), *local_command(service)], cwd=work,
                                               env=env, stdout=log, stderr=log)  # fmt: skip
        for name, service in services.items():

            def healthy(name: str = name, service: dict[str, Any] = service) -> bool:
                assert procs[name].poll() is None, (tmp_path / f"{name}.log").read_text()
                check = [*hosts.exec_prefix(ns[name]), *healthcheck(service)]
                return subprocess.run(check, capture_output=True, timeout=10).returncode == 0

            wait_until(healthy, timeout=60, what=f"{name}'s healthcheck to pass")

        def roost(*args: str, timeout: float = 30) -> subprocess.CompletedProcess[str]:
            return subprocess.run([*hosts.exec_prefix(ns[CLIENT_HOST]), sys.executable, "-m", "roost", *args],
                                  capture_output=True, text=True, timeout=timeout, cwd=ROOT)  # fmt: skip

        status = roost("status", "--node", "n2:7402", "--json")
        assert status.returncode == 0, status.stderr
        members = json.loads(status.stdout)["members"]
        assert [(m["id"], m["state"]) for m in members] == [(s, "ready") for s in services]
        # A client in another container names every member by service (docs/operations.md): the
        # members advertise the host's published ports, and a member's datagrams are taken only
        # from an address the client knows (here n3's, which delivers what is published there).
        every = ",".join(f"{name}:{7400 + i}" for i, name in enumerate(services, 1))
        sub = subprocess.Popen([*hosts.exec_prefix(ns[CLIENT_HOST]), sys.executable, "-m", "roost", "sub", "c.t",
                                "--node", every, "--count", "3", "--timeout", "30"],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT)  # fmt: skip
        wait_until(lambda: roost("status", "--node", "n3:7403", "--json").stdout.count('"subscriptions": 1') >= 3,
                   what="the subscription on every member")  # fmt: skip
        pub = roost("pub", "c.t", "m{n}", "--count", "3", "--node", "n3:7403")
        assert pub.returncode == 0, pub.stderr
        out, err = sub.communicate(timeout=30)
        assert (sub.returncode, out.split()) == (0, ["m0", "m1", "m2"]), err
    finally:
        for p in procs.values():
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        codes = {name: p.wait(30) for name, p in procs.items()}
    assert codes == dict.fromkeys(services, 0), {n: (tmp_path / f"{n}.log").read_text()[-2000:] for n in services}
    for name in services:
        text = (tmp_path / f"{name}.log").read_text()
        assert text.count("event=node_stopped") == 1 and "Traceback" not in text
