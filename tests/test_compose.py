"""The compose files and Dockerfile against the compose-spec schema and the cluster configs they run:
docker-compose.yml (configs/cluster3.toml, replicated) and docker-compose.partitioned.yml
(configs/cluster5-partitioned.toml).

There is no Docker engine where these tests run, so the compose file is checked, not started:
it must be valid Compose and agree with the cluster config it runs (names, ports, data dirs).
"""

from __future__ import annotations

import json
import os
import posixpath
import re
import shlex
import tomllib
from typing import Any

import pytest
import yaml
from jsonschema import Draft7Validator  # type: ignore[import-untyped]  # no stubs in the dev extras

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DOCKERFILE = os.path.join(ROOT, "Dockerfile")
# In-repo copy (CI runs on a clean clone); provenance in docs/docker.md.
SCHEMA = os.path.join(ROOT, "tests", "data", "compose-spec.json")
SHARED_SCHEMA = os.path.join(ROOT, "..", "shared", "schemas", "compose-spec.json")

# (compose file, the cluster config its services run)
SETUPS = [
    ("docker-compose.yml", "configs/compose3.toml"),
    ("docker-compose.partitioned.yml", "configs/compose5-partitioned.toml"),
]
setups = pytest.mark.parametrize("setup", SETUPS, ids=[c for c, _ in SETUPS])
WORKDIR = "/var/lib/roost"
HOST_IP = "127.0.0.1"


def in_container(setup: tuple[str, str]) -> str:
    return "/etc/roost/" + posixpath.basename(setup[1])


def on_host(setup: tuple[str, str]) -> str:
    return "./" + setup[1]


def load_compose(setup: tuple[str, str]) -> dict[str, Any]:
    with open(os.path.join(ROOT, setup[0]), encoding="utf-8") as f:
        doc = yaml.safe_load(f)
    assert isinstance(doc, dict), "docker-compose.yml is not a mapping"
    return doc


def load_members(setup: tuple[str, str]) -> list[dict[str, Any]]:
    with open(os.path.join(ROOT, setup[1]), "rb") as f:
        members = tomllib.load(f)["members"]
    assert members, f"{setup[1]} has no [[members]]"
    return list(members)


def port_of(addr: str) -> int:
    return int(addr.rsplit(":", 1)[1])


def expected_ports(member: dict[str, Any]) -> set[tuple[int, str]]:
    return {
        (port_of(member["client_addr"]), "udp"),
        (port_of(member["peer_addr"]), "tcp"),
        (port_of(member["monitor_addr"]), "tcp"),
    }


def command_args(service: dict[str, Any]) -> list[str]:
    cmd = service.get("command")
    if isinstance(cmd, str):
        return shlex.split(cmd)
    assert isinstance(cmd, list), f"command missing or not a list/string: {cmd!r}"
    return [str(a) for a in cmd]


def option_values(args: list[str], option: str) -> list[str]:
    """Every value given to OPTION, as ``--opt value`` or ``--opt=value``."""
    values = []
    for i, arg in enumerate(args):
        if arg == option and i + 1 < len(args):
            values.append(args[i + 1])
        elif arg.startswith(option + "="):
            values.append(arg[len(option) + 1 :])
    return values


def parse_port(spec: Any) -> tuple[str, int, int, str]:
    """(host_ip, published, target, protocol) of one `ports` entry (short or long syntax)."""
    if isinstance(spec, dict):
        return (
            str(spec.get("host_ip", "")),
            int(spec["published"]),
            int(spec["target"]),
            str(spec.get("protocol", "tcp")),
        )
    m = re.fullmatch(r"(?:(?P<ip>[^:]+):)?(?P<published>\d+):(?P<target>\d+)(?:/(?P<proto>tcp|udp))?", str(spec))
    assert m, f"unsupported port syntax (want [IP:]HOST:CONTAINER[/proto]): {spec!r}"
    return m["ip"] or "", int(m["published"]), int(m["target"]), m["proto"] or "tcp"


def parse_volume(spec: Any) -> tuple[str, str, bool]:
    """(source, target, read_only) of one service `volumes` entry (short or long syntax)."""
    if isinstance(spec, dict):
        return str(spec.get("source", "")), str(spec["target"]), bool(spec.get("read_only", False))
    parts = str(spec).split(":")
    assert len(parts) in (2, 3), f"unsupported volume syntax: {spec!r}"
    mode = parts[2].split(",") if len(parts) == 3 else []
    return parts[0], parts[1], "ro" in mode


def parse_expose(text: str) -> set[tuple[int, str]]:
    """Ports named by the Dockerfile's EXPOSE instructions (continuation lines joined)."""
    text = re.sub(r"\\\r?\n", " ", text)
    ports: set[tuple[int, str]] = set()
    for line in text.splitlines():
        words = line.split()
        if not words or words[0].upper() != "EXPOSE":
            continue
        for word in words[1:]:
            port, _, proto = word.partition("/")
            ports.add((int(port), proto.lower() or "tcp"))
    return ports


# --- (a) schema -------------------------------------------------------------------------------


@setups
def test_compose_file_validates_against_compose_spec_schema(setup: tuple[str, str]) -> None:
    with open(SCHEMA, encoding="utf-8") as f:
        schema = json.load(f)
    Draft7Validator.check_schema(schema)
    errors = sorted(Draft7Validator(schema).iter_errors(load_compose(setup)), key=lambda e: list(e.absolute_path))
    for err in errors:
        print(f"{'/'.join(map(str, err.absolute_path)) or '<root>'}: {err.message}")
    assert not errors, f"{len(errors)} schema error(s) in {setup[0]} (printed above)"


@setups
def test_compose_file_has_no_obsolete_version_key(setup: tuple[str, str]) -> None:
    assert "version" not in load_compose(setup)


# SHA-256 of compose-spec.json at commit 170098ba07d9f53c383a41bfd4c5166b0a4529a6 (docs/docker.md).
SCHEMA_SHA256 = "1f91e091f16b2dd50ab8860e02bb391d22df553d91c145eacedb1b6eff9c3f0e"


def test_in_repo_schema_is_the_recorded_upstream_file() -> None:
    import hashlib

    with open(SCHEMA, "rb") as a:
        assert hashlib.sha256(a.read()).hexdigest() == SCHEMA_SHA256
    if os.path.exists(SHARED_SCHEMA):  # where ../shared exists, it must be the same file
        with open(SHARED_SCHEMA, "rb") as b:
            assert hashlib.sha256(b.read()).hexdigest() == SCHEMA_SHA256


# --- (b) agreement with the cluster config it runs ----------------------------------------------


@setups
def test_services_are_exactly_the_members(setup: tuple[str, str]) -> None:
    services = load_compose(setup)["services"]
    assert set(services) == {m["id"] for m in load_members(setup)}


@setups
def test_each_service_runs_its_member(setup: tuple[str, str]) -> None:
    services = load_compose(setup)["services"]
    ids = [m["id"] for m in load_members(setup)]
    for mid in ids:
        service = services[mid]
        args = command_args(service)
        assert args[0] == "node", f"{mid}: command must start with `node`: {args}"
        assert option_values(args, "--id") == [mid], f"{mid}: wrong --id in {args}"
        assert option_values(args, "--config") == [in_container(setup)], f"{mid}: wrong --config in {args}"
        assert option_values(args, "--bind-host") == ["0.0.0.0"], f"{mid}: wrong --bind-host in {args}"
        peer_hosts = dict(v.split("=", 1) for v in option_values(args, "--peer-host"))
        assert peer_hosts == {i: i for i in ids}, f"{mid}: --peer-host must map every member to its service"
        assert service.get("working_dir") == WORKDIR, f"{mid}: working_dir"
        assert service.get("restart") == "unless-stopped", f"{mid}: restart"
        assert service.get("stop_signal") == "SIGTERM", f"{mid}: stop_signal"
        assert service.get("stop_grace_period"), f"{mid}: stop_grace_period"
        assert service.get("build") == ".", f"{mid}: build"
        assert service.get("image") == "roost:latest", f"{mid}: image"


@setups
def test_published_ports_match_member_ports(setup: tuple[str, str]) -> None:
    services = load_compose(setup)["services"]
    for member in load_members(setup):
        mid = member["id"]
        parsed = [parse_port(p) for p in services[mid].get("ports", [])]
        for host_ip, published, target, _proto in parsed:
            assert host_ip == HOST_IP, f"{mid}: port {target} must be published on {HOST_IP}, not {host_ip!r}"
            assert published == target, f"{mid}: host port {published} != container port {target}"
        published_set = {(target, proto) for _ip, _pub, target, proto in parsed}
        assert len(parsed) == len(published_set), f"{mid}: duplicate port entries"
        assert published_set == expected_ports(member), f"{mid}: ports {published_set} != {expected_ports(member)}"


@setups
def test_each_data_dir_has_its_own_named_volume(setup: tuple[str, str]) -> None:
    compose = load_compose(setup)
    declared = set(compose.get("volumes") or {})
    used: dict[str, str] = {}
    for member in load_members(setup):
        mid = member["id"]
        target = posixpath.join(WORKDIR, member["data_dir"])
        mounts = {t: s for s, t, _ro in map(parse_volume, compose["services"][mid].get("volumes", []))}
        assert target in mounts, f"{mid}: no volume mounted at {target}"
        source = mounts[target]
        assert source in declared, f"{mid}: {source!r} at {target} is not a declared named volume"
        assert source not in used, f"{mid}: volume {source!r} is shared with {used.get(source)}"
        used[source] = mid


@setups
def test_config_is_mounted_read_only(setup: tuple[str, str]) -> None:
    assert os.path.isfile(os.path.join(ROOT, on_host(setup)))
    services = load_compose(setup)["services"]
    for member in load_members(setup):
        mid = member["id"]
        mounts = {t: (s, ro) for s, t, ro in map(parse_volume, services[mid].get("volumes", []))}
        assert mounts.get(in_container(setup)) == (on_host(setup), True), (
            f"{mid}: want {on_host(setup)}:{in_container(setup)}:ro, got {mounts.get(in_container(setup))}"
        )


# --- (c) Dockerfile ---------------------------------------------------------------------------


@setups
def test_dockerfile_exposes_every_member_port(setup: tuple[str, str]) -> None:
    with open(DOCKERFILE, encoding="utf-8") as f:
        exposed = parse_expose(f.read())
    wanted = set().union(*(expected_ports(m) for m in load_members(setup)))
    assert wanted <= exposed, f"Dockerfile EXPOSE misses {sorted(wanted - exposed)}"


def test_dockerfile_basics() -> None:
    with open(DOCKERFILE, encoding="utf-8") as f:
        lines = [ln.strip() for ln in f if ln.strip() and not ln.lstrip().startswith("#")]
    assert lines[0] == "FROM python:3.11-slim"
    assert 'ENTRYPOINT ["roost"]' in lines
    users = [ln.split()[1] for ln in lines if ln.upper().startswith("USER ")]
    assert users and users[-1] not in ("root", "0"), "image must run as a non-root user"
