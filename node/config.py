"""Node configuration: TOML, validated at load with messages that name the file,
the key and what is allowed.

Every timeout and limit lives here with its default; docs/configuration.md is
generated from the same table (``roost config-doc``), so the two cannot drift.
"""

from __future__ import annotations

import ipaddress
import os
import re
import stat
import tomllib
from collections.abc import Callable
from copy import copy
from dataclasses import dataclass
from pathlib import Path
from typing import Any


class ConfigError(Exception):
    """A config file that cannot be used; the message is meant for an operator."""


def parse_hostport(value: str) -> tuple[str, int]:
    """``"127.0.0.1:7400"`` -> ``("127.0.0.1", 7400)``; raises ValueError."""
    host, sep, port = value.rpartition(":")
    if not sep or not host:
        raise ValueError("expected HOST:PORT")
    host = host.strip("[]")
    ipaddress.ip_address(host)
    p = int(port)
    if not 0 <= p <= 65535:
        raise ValueError("port out of range")
    return host, p


@dataclass(frozen=True)
class Setting:
    section: str
    key: str
    default: Any
    kind: type
    allowed: str
    check: Callable[[Any], bool]
    doc: str


def _num(lo: float, hi: float) -> Callable[[Any], bool]:
    return lambda v: lo <= v <= hi


def number(section: str, key: str, default: Any, kind: type, lo: float, hi: float, doc: str) -> Setting:
    """A numeric setting within [lo, hi]: its check and the words that say what is allowed come
    from the same bounds, so the error message and docs/configuration.md cannot drift from them."""
    what = "an integer" if kind is int else "a number of seconds"
    return Setting(section, key, default, kind, f"{what} from {_plain(lo)} to {_plain(hi)}", _num(lo, hi), doc)


def _plain(x: float) -> str:
    return str(int(x)) if x == int(x) else str(x)


def _addr_ok(v: str) -> bool:
    try:
        parse_hostport(v)
    except ValueError:
        return False
    return True


def advertisable(addr: tuple[str, int]) -> bool:
    """An address a client can be sent to: a port, and a host that is not a wildcard."""
    return addr[1] != 0 and not ipaddress.ip_address(addr[0]).is_unspecified


def _advertise_ok(v: str) -> bool:
    try:
        return advertisable(parse_hostport(v))
    except ValueError:
        return False


#: What a bearer token may be: RFC 6750's b64token (what an HTTP header carries as it is), long
#: enough not to be guessed. ``openssl rand -hex 24`` or ``-base64 32`` makes one.
TOKEN_ALLOWED = "16 to 1024 characters of A-Z a-z 0-9 - . _ ~ + / (= only at the end)"
TOKEN_ENV = "ROOST_MONITOR_TOKEN"
_TOKEN = re.compile(r"[A-Za-z0-9._~+/-]+=*")


def _nets_ok(v: list[Any]) -> bool:
    try:
        for n in v:
            ipaddress.ip_network(n)
    except (ValueError, TypeError):
        return False
    return True


SETTINGS: list[Setting] = [
    Setting("node", "id", "n1", str, "1..64 chars of [A-Za-z0-9_.-]",
            lambda v: 0 < len(v) <= 64 and all(c.isalnum() or c in "_.-" for c in v),
            "Node id; appears in every log line and in the cluster map."),
    Setting("node", "client_addr", "127.0.0.1:7400", str, "HOST:PORT with an IP address",
            _addr_ok, "UDP address clients talk to (text and binary protocol)."),
    Setting("node", "text_networks", ["127.0.0.0/8", "::1/128"], list,
            "a list of CIDR networks", _nets_ok,
            "Source networks allowed to use the text protocol (it has no address "
            "validation, so it must stay on networks you trust)."),
    Setting("node", "advertise_addr", "", str,
            "empty (client_addr) or HOST:PORT with an IP address that is not a wildcard, and a port other than 0",
            lambda v: v == "" or _advertise_ok(v),
            "The address WELCOME and cluster maps tell clients to use for this node, when it is not "
            "the bound one: a published container port, a NAT, a load balancer's address."),
    Setting("node", "log_level", "info", str, "one of debug, info, warning, error",
            lambda v: v in ("debug", "info", "warning", "error"), "Log verbosity."),
    Setting("node", "log_format", "logfmt", str, '"logfmt" or "json"', lambda v: v in ("logfmt", "json"),
            "logfmt: `time LEVEL node=ID event=NAME key=value...`; json: one JSON object per line "
            "with the same fields (`ts`, `level`, `node`, `event`, ...). Rotation is the platform's "
            "(journald, Docker's log driver, logrotate with copytruncate)."),
    Setting("monitor", "addr", "", str, "empty (off) or HOST:PORT with an IP address",
            lambda v: v == "" or _addr_ok(v),
            "HTTP monitoring endpoint (/healthz, /varz, /connz, /subsz, /clusterz, /metrics; "
            "docs/operations.md). Off by default; keep it on loopback or a private network, and set "
            "token (or token_file) when anyone else can reach it: a node that binds it on any other "
            "address without a token logs monitor_unprotected at start. A cluster member sets it as "
            "`monitor_addr` in its `[[members]]` entry, never in a cluster config's [monitor]."),
    number("monitor", "max_connections", 32, int, 1, 10000,
            "Monitoring connections open at once. A connection past it takes the place of the one "
            "idle the longest (connected, no request under way), which is closed; it is refused "
            "(closed at once, no task kept) only when every connection has a request under way, so "
            "idle connections can never shut out /healthz (docs/security.md)."),
    number("monitor", "max_per_host", 8, int, 1, 10000,
            "Monitoring connections one source address may hold (at most max_connections): past it "
            "that address's idle one is closed, or the new one refused, so one host's slow requests "
            "cannot take every slot."),
    number("monitor", "idle_timeout", 10.0, float, 0.1, 3600,
            "A monitoring connection that has no request under way (none sent yet, or the last "
            "one answered) is closed after this long."),
    number("monitor", "request_timeout", 5.0, float, 0.1, 600,
            "A monitoring request must be read and its answer sent within this long of its first "
            "byte, or the connection is closed: a request trickled a byte at a time (slowloris) or a "
            "client that does not read its answer lets go of its slot. At most connection_timeout."),
    number("monitor", "connection_timeout", 30.0, float, 0.1, 3600,
            "Any monitoring connection is closed after this long, busy or not (keep-alive clients "
            "open a new one)."),
    number("monitor", "max_request_head", 8192, int, 1024, 1 << 20,
            "Largest HTTP request line and headers accepted by the monitoring endpoint (431 above)."),
    Setting("monitor", "token", "", str, f"empty (none) or {TOKEN_ALLOWED}", lambda v: True,
            "A bearer token every path but /healthz requires (`Authorization: Bearer TOKEN`, else 401). "
            "Keep it out of tracked files: use token_file or the environment variable "
            "ROOST_MONITOR_TOKEN instead (read when neither is set; `roost status` and `roost top` "
            "send the same variable)."),
    Setting("monitor", "token_file", "", str, "empty or a file path, readable by its owner only",
            lambda v: True,
            "A file holding the token (its first line), relative to the config file's directory; "
            "refused if group or others may read it (chmod 600). Instead of token."),
    number("limits", "max_datagram", 16384, int, 1200, 65507,
            "Largest datagram accepted or sent. Bigger datagrams are refused with "
            "too_large; outgoing batches are coalesced up to this size."),
    number("limits", "socket_buffer", 8 << 20, int, 65536, 1 << 30,
            "Kernel receive and send buffer of the client port (SO_RCVBUF, SO_SNDBUF), bytes: set "
            "past the system's net.core.rmem_max/wmem_max when the node runs as root, else up to "
            "them. Datagrams of a burst beyond it are dropped by the kernel (reliable ones resent)."),
    number("limits", "max_payload", 1 << 20, int, 1024, 64 << 20,
            "Largest payload of a message sent in parts, told to clients in WELCOME: a reliable "
            "message larger than one datagram is sent in parts that the subscriber puts together, "
            "at most a quarter of send_window of them; fire messages are one datagram each. At "
            "most send_window / 4 times max_datagram / 2."),
    number("limits", "mailbox_capacity", 50000, int, 16, 10_000_000,
            "Reliable messages a subscriber may have unacknowledged before its "
            "reliable subscriptions are cancelled with out_of_capacity."),
    Setting("limits", "mailbox_max_bytes", 64 * 1024 * 1024, int, "an integer from 65536 to 2**40", _num(65536, 2**40),
            "Bytes of unacknowledged reliable messages one subscriber may hold."),
    number("limits", "send_window", 4096, int, 1, 1_000_000,
            "Reliable messages sent to one subscriber but not yet acknowledged."),
    number("limits", "send_window_bytes", 2 << 20, int, 65536, 1 << 30,
            "Bytes of reliable messages sent to one subscriber but not yet acknowledged (one "
            "message at least): keep it under the subscribers' socket receive buffer, or a burst "
            "of large messages overruns it and is resent."),
    number("limits", "max_clients", 100000, int, 1, 100_000_000,
            "Binary clients with subscriptions a node keeps state for (fair shares per host above "
            "admission_share of it)."),
    number("limits", "max_subscriptions_per_client", 10000, int, 1, 10_000_000,
            "Subscriptions one client may hold."),
    number("limits", "max_subscriptions", 1_000_000, int, 1, 1_000_000_000,
            "Subscriptions a node holds (in a replicated cluster: every member holds every one)."),
    number("limits", "max_subscriptions_per_host", 10_000, int, 1, 1_000_000_000,
            "Subscriptions the clients of one source host (one IPv4 address, one IPv6 /64) may hold "
            "on the member they talk to: it takes max_subscriptions / this many hosts to fill "
            "the node (docs/security.md)."),
    Setting("limits", "max_filter_bytes", 64 << 20, int, "an integer from 65536 to 2**40", _num(65536, 2**40),
            "Bytes of subscription filters (topics, patterns, queries) a node holds: with "
            "max_subscriptions, what bounds the memory subscriptions take (docs/security.md)."),
    Setting("limits", "max_filter_bytes_per_host", 2 << 20, int, "an integer from 4096 to 2**40",
            _num(4096, 2**40), "Bytes of subscription filters the clients of one source host may hold."),
    number("limits", "max_tombstones_per_host", 100_000, int, 1, 1_000_000_000,
            "In a cluster, the ended subscriptions (tombstones, kept tombstone_horizon so that a late "
            "copy cannot bring one back) the clients of one source host may leave on the member they "
            "talk to; past it their new subscriptions are refused until tombstones are collected (one "
            "that replaces a tombstone of its own is not). The default lets a host end about 28 "
            "subscriptions a second, every second of an hour: ten restarts an hour of processes "
            "holding max_subscriptions_per_host."),
    number("limits", "max_tombstones", 1_000_000, int, 1, 1_000_000_000,
            "Tombstones a cluster member holds (every member holds every one in a replicated cluster), "
            "with fair shares per host above admission_share of it."),
    Setting("limits", "max_mailbox_bytes", 1 << 30, int, "an integer from 1048576 to 2**44", _num(1 << 20, 1 << 44),
            "Bytes of unacknowledged reliable messages all the subscribers of a node may hold together."),
    Setting("limits", "admission_share", 0.8, float, "a number from 0.1 to 1", _num(0.1, 1.0),
            "Share of max_subscriptions, max_filter_bytes, max_mailbox_bytes or max_clients above "
            "which a node admits new subscriptions (over_capacity otherwise, as Tendermint's ADR 033 asks) and client "
            "records (overloaded) only for a host holding less than its fair share of that pool "
            "(the share over the hosts holding any), up to the limit itself: the hosts that filled "
            "it are refused, not a newcomer."),
    number("limits", "max_text_subscribers", 100000, int, 0, 100_000_000,
            "Text-protocol subscriptions (address, topic) a node keeps."),
    Setting("limits", "text_amplification", 3.0, float, "0 (off) or a number from 1 to 100",
            lambda v: v == 0 or 1 <= v <= 100,
            "A text subscriber is sent at most this many times the bytes it sent the node (its SUBs, "
            "renewals, any datagram; a SUB's body is ignored and may pad it): a text source address "
            "is never validated, so a forged SUB must not make the node a reflector. 0 lifts the "
            "bound, for text_networks where no one can forge a source address."),
    number("limits", "max_producers", 100000, int, 1, 100_000_000,
            "Producers whose sequence numbers are remembered for dedup."),
    Setting("limits", "max_host_bytes_per_second", 1 << 30, int, "0 (off) or an integer from 65536 to 2**40",
            lambda v: v == 0 or 65536 <= v <= 2**40,
            "Bytes a second one source address may send the node (a bucket of one second's worth); "
            "what is over it is dropped unread (dropped_host_rate). The default, 1 GiB/s, is above "
            "what one host reaches on the machines we measured (docs/performance.md: 340 MB/s): it "
            "caps a host on a faster one, not a benchmark."),
    number("limits", "max_per_host", 10000, int, 1, 100_000_000,
            "Binary clients, and producers, one source IP may have on a node: one host "
            "cannot use up max_clients or max_producers for everybody."),
    number("timeouts", "subscriber_timeout", 10.0, float, 0.1, 86400,
            "A binary client silent this long (no PING, ACK or command) is dropped "
            "with all its subscriptions."),
    number("timeouts", "retransmit_timeout", 0.2, float, 0.001, 60,
            "First retransmission of unacknowledged reliable messages."),
    number("timeouts", "retransmit_max", 2.0, float, 0.001, 600, "Cap of the exponential retransmission back-off."),
    Setting("timeouts", "text_sub_lease", 120.0, float,
            "0 (off) or a number of seconds up to 86400", _num(0, 86400),
            "Text subscriptions expire this long after their last SUB unless a SUB renews them: "
            "a forged SUB (a text source address is never validated) does not last. 0 keeps them "
            "until UNSUB."),
    number("timeouts", "producer_timeout", 300.0, float, 1, 604800,
            "How long a silent producer's dedup state is kept."),
    number("timeouts", "cookie_lifetime", 600.0, float, 1, 86400,
            "A node's address-validation cookie key is replaced this often (a random key of "
            "its own; the one before it is still accepted): a cookie is valid one to two lifetimes."),
    number("timeouts", "ping_interval", 0.5, float, 0.01, 60,
            "Told to clients in WELCOME: how often to PING while subscribed."),
]  # fmt: skip


class NodeConfig:
    """The validated configuration of one node; attribute names are the TOML keys.

    Defaults come from SETTINGS, the single table that also documents them.
    """

    id: str
    client_addr: tuple[str, int]
    advertise_addr: str
    text_networks: list[str]
    log_level: str
    log_format: str
    monitor_addr: str
    monitor_max_connections: int
    monitor_max_per_host: int
    monitor_idle_timeout: float
    monitor_request_timeout: float
    monitor_connection_timeout: float
    monitor_max_request_head: int
    monitor_token: str
    monitor_token_file: str
    max_datagram: int
    socket_buffer: int
    max_payload: int
    mailbox_capacity: int
    mailbox_max_bytes: int
    max_per_host: int
    max_host_bytes_per_second: int
    send_window: int
    send_window_bytes: int
    max_clients: int
    max_subscriptions_per_client: int
    max_subscriptions: int
    max_subscriptions_per_host: int
    max_filter_bytes: int
    max_filter_bytes_per_host: int
    max_mailbox_bytes: int
    max_tombstones_per_host: int
    max_tombstones: int
    admission_share: float
    max_text_subscribers: int
    max_producers: int
    subscriber_timeout: float
    retransmit_timeout: float
    retransmit_max: float
    text_sub_lease: float
    text_amplification: float
    producer_timeout: float
    cookie_lifetime: float
    ping_interval: float
    # Not settings (no TOML key sets them): the simulator's instruments, read by the cores.
    #: Emit node/actions.py ``Trace`` actions for the simulator's checkers.
    trace: bool = False
    #: Deliberately broken mechanisms (sim/breaks.py names them): a campaign over a broken build
    #: must report violations, which shows its checker can fail. Empty in every shipped build.
    breaks: frozenset[str] = frozenset()

    def __init__(self, **overrides: Any) -> None:
        fill_defaults(self, SETTINGS)
        for k, v in overrides.items():
            if (k not in self.__annotations__) or k == "source":
                raise TypeError(f"unknown setting {k}")
            setattr(self, k, v)
        self.source = "<defaults>"


def attr_of(section: str, key: str) -> str:
    """The attribute a setting is stored in: its key, or ``monitor_addr`` for [monitor] addr
    (a NodeConfig holds the settings of several sections side by side)."""
    if section == "durable" and key == "replicas":  # (beside [cluster] replicas)
        return "durable_replicas"
    return f"monitor_{key}" if section == "monitor" else key


def fill_defaults(obj: Any, table: list[Setting]) -> None:
    """Set every setting of ``table`` on ``obj`` to its documented default."""
    for s in table:
        value = parse_hostport(s.default) if s.key == "client_addr" else copy(s.default)
        setattr(obj, attr_of(s.section, s.key), value)


def validate_value(source: str, section: str, key: str, value: Any, table: list[Setting] | None = None) -> Any:
    """Check one TOML value against a settings table; returns it converted."""
    table = SETTINGS if table is None else table
    s = next((x for x in table if x.section == section and x.key == key), None)
    if s is None:
        known = ", ".join(x.key for x in table if x.section == section)
        raise ConfigError(f"{source}: [{section}] {key}: unknown key; known keys: {known}")
    v = value
    if s.kind is float and isinstance(v, int) and not isinstance(v, bool):
        v = float(v)
    if not isinstance(v, s.kind) or (isinstance(v, bool) and s.kind is not bool) or not s.check(v):
        raise ConfigError(f"{source}: [{section}] {key} = {value!r}: must be {s.allowed}")
    if key == "client_addr":
        return parse_hostport(str(v))
    return v


def apply_sections(
    cfg: Any, source: str, data: dict[str, Any], sections: tuple[str, ...],
    table: list[Setting] | None = None,
) -> None:  # fmt: skip
    """Validate the given sections of a parsed TOML table into ``cfg``."""
    for section in sections:
        values = data.get(section, {})
        if not isinstance(values, dict):
            raise ConfigError(f"{source}: [{section}] must be a table")
        for key, value in values.items():
            setattr(cfg, attr_of(section, key), validate_value(source, section, key, value, table))


NODE_SECTIONS = ("node", "limits", "timeouts", "monitor")


def read_toml(path: str | Path) -> dict[str, Any]:
    source = str(path)
    try:
        with open(path, "rb") as f:
            return tomllib.load(f)
    except OSError as exc:
        raise ConfigError(f"{source}: cannot read: {exc.strerror}") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{source}: not valid TOML: {exc}") from None
    except UnicodeDecodeError as exc:  # (TOML is UTF-8: tomllib decodes the file first)
        raise ConfigError(f"{source}: not valid TOML: not UTF-8 at byte {exc.start}") from None


def load_node_config(path: str | Path | None, data: dict[str, Any] | None = None) -> NodeConfig:
    """Load and validate a single-node config; no path means all defaults."""
    cfg = NodeConfig()
    if path is None:
        return cfg
    source = str(path)
    data = read_toml(path) if data is None else data
    extra = set(data) - set(NODE_SECTIONS)
    if extra:
        raise ConfigError(
            f"{source}: unknown section [{sorted(extra)[0]}]; "
            f"allowed: {', '.join('[' + s + ']' for s in NODE_SECTIONS)}"
        )
    apply_sections(cfg, source, data, NODE_SECTIONS)
    check_consistency(cfg, source)
    resolve_monitor_token(cfg, source)
    cfg.source = source
    return cfg


def check_consistency(cfg: NodeConfig, source: str) -> None:
    if cfg.retransmit_max < cfg.retransmit_timeout:
        raise ConfigError(
            f"{source}: [timeouts] retransmit_max = {cfg.retransmit_max}: must be at least "
            f"retransmit_timeout ({cfg.retransmit_timeout})"
        )
    if cfg.send_window > cfg.mailbox_capacity:
        raise ConfigError(
            f"{source}: [limits] send_window = {cfg.send_window}: must be at most "
            f"mailbox_capacity ({cfg.mailbox_capacity})"
        )
    if cfg.max_payload > cfg.send_window // 4 * (cfg.max_datagram // 2):
        raise ConfigError(
            f"{source}: [limits] max_payload = {cfg.max_payload}: must be at most a quarter of send_window "
            f"times half of max_datagram ({cfg.send_window // 4 * (cfg.max_datagram // 2)}), so that a queue "
            f"group's member can hold every part of four such messages unacknowledged"
        )
    if cfg.monitor_request_timeout > cfg.monitor_connection_timeout:
        raise ConfigError(
            f"{source}: [monitor] request_timeout = {cfg.monitor_request_timeout}: must be at most "
            f"connection_timeout ({cfg.monitor_connection_timeout})"
        )
    if cfg.subscriber_timeout <= cfg.ping_interval * 2:
        raise ConfigError(
            f"{source}: [timeouts] subscriber_timeout = {cfg.subscriber_timeout}: must be more "
            f"than twice ping_interval ({cfg.ping_interval})"
        )


def resolve_monitor_token(cfg: NodeConfig, source: str) -> None:
    """Set ``cfg.monitor_token`` to the token the endpoint requires: [monitor] token, or the first
    line of [monitor] token_file, or (when the config has neither) $ROOST_MONITOR_TOKEN; empty
    for none. The way the cluster secret is found, so that neither need be in a tracked file.
    Errors name the key and what is allowed, never the token."""
    if cfg.monitor_token and cfg.monitor_token_file:
        raise ConfigError(f"{source}: [monitor] token and token_file: set one of them, not both")
    if cfg.monitor_token_file:
        where = f"[monitor] token_file = {cfg.monitor_token_file!r}"
        token = read_secret_line(source, where, cfg.monitor_token_file)
        if not token:
            raise ConfigError(f"{source}: {where}: the file's first line is empty; it must hold {TOKEN_ALLOWED}")
    elif cfg.monitor_token:
        token, where = cfg.monitor_token, "[monitor] token"
    else:
        token, where = os.environ.get(TOKEN_ENV, ""), f"[monitor] token (from ${TOKEN_ENV})"
    if token and not (16 <= len(token) <= 1024 and _TOKEN.fullmatch(token)):
        bad = "" if _TOKEN.fullmatch(token) else ", some of them not allowed"
        raise ConfigError(f"{source}: {where}: must be {TOKEN_ALLOWED} (it has {len(token)} characters{bad})")
    cfg.monitor_token = token


def read_secret_line(source: str, where: str, name: str) -> str:
    """The first line of the file ``name`` (relative to the config's directory), stripped. A file
    that group or others may read is refused, as ssh refuses such a key: whoever can read it can
    use the secret, and a mode we accept now would stay unnoticed."""
    path = Path(name) if Path(name).is_absolute() else Path(source).parent / name
    try:
        mode = path.stat().st_mode
        if mode & (stat.S_IRGRP | stat.S_IROTH):
            raise ConfigError(f"{source}: {where}: {path} is readable by group or others (mode "
                              f"{stat.S_IMODE(mode):04o}): it must be readable by its owner only "
                              "(chmod 600)")  # fmt: skip
        lines = path.read_text().splitlines()
    except (OSError, ValueError) as exc:  # (UnicodeDecodeError; a NUL in the path: "embedded null byte")
        why = getattr(exc, "strerror", None) or str(exc)
        raise ConfigError(f"{source}: {where}: cannot read {path}: {why}") from None
    return lines[0].strip() if lines else ""


def config_doc(table: list[Setting] | None = None) -> str:
    """Markdown table of every setting, for docs/configuration.md."""
    rows = ["| section | key | default | allowed | meaning |", "|---|---|---|---|---|"]
    for s in SETTINGS if table is None else table:
        default = str(s.default).lower() if isinstance(s.default, bool) else repr(s.default)  # (as TOML writes it)
        rows.append(f"| [{s.section}] | `{s.key}` | `{default}` | {s.allowed} | {s.doc} |")
    return "\n".join(rows) + "\n"
