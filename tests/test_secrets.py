"""Where a cluster's secret comes from (cluster/secretfile.py): secret files readable by group
or others refused, the file `roost cluster up` creates, and the shipped configs, which carry no
secret and trust loopback only for the text protocol."""

from __future__ import annotations

import ipaddress
import os
import re
import stat
import tomllib
from pathlib import Path

import pytest

from roost.cluster.config import load_cluster_config
from roost.cluster.launcher import write_local_config
from roost.cluster.secretfile import SECRET_ENV, ensure_secret_file
from roost.node.config import SETTINGS, ConfigError
from tests.clusterkit import ROOT, roost

ENV_SECRET = "from-the-environment-0123"


@pytest.fixture
def no_env(monkeypatch):
    monkeypatch.delenv(SECRET_ENV, raising=False)


def config_with(tmp_path: Path, cluster: str) -> Path:
    """A 2-member cluster config on free ports whose [cluster] table is ``cluster``."""
    p = tmp_path / "c.toml"
    write_local_config(p, 2)
    p.write_text(p.read_text().replace('secret = "local-secret-0123456789"\n', cluster + "\n"))
    return p


def secret_file(path: Path, mode: int, text: str = "from-a-file-0123456789\nignored\n") -> Path:
    path.write_text(text)
    path.chmod(mode)
    return path


@pytest.mark.parametrize("mode", [0o644, 0o640, 0o604, 0o620, 0o602, 0o660])
def test_a_secret_file_group_or_others_may_read_or_change_is_refused(tmp_path, no_env, mode):
    secret_file(tmp_path / "s", mode)
    p = config_with(tmp_path, 'secret_file = "s"')
    with pytest.raises(ConfigError) as exc:
        load_cluster_config(p)
    why = str(exc.value)
    for needle in (str(p), "[cluster] secret_file = 's'", str(tmp_path / "s"), f"mode {mode:04o}",
                   f"chmod 600 {tmp_path / 's'}", "allow_insecure_secret_file = true"):  # fmt: skip
        assert needle in why, (needle, why)


@pytest.mark.parametrize("mode", [0o600, 0o400])
def test_a_secret_file_of_its_owner_only_is_read(tmp_path, no_env, mode):
    secret_file(tmp_path / "s", mode)
    cc = load_cluster_config(config_with(tmp_path, 'secret_file = "s"'))
    assert (cc.settings.secret, cc.settings.secret_from) == ("from-a-file-0123456789", "file")


def test_allow_insecure_secret_file_takes_a_shared_file(tmp_path, no_env):
    secret_file(tmp_path / "s", 0o640)
    cc = load_cluster_config(config_with(tmp_path, 'secret_file = "s"\nallow_insecure_secret_file = true'))
    assert cc.settings.secret == "from-a-file-0123456789" and cc.settings.allow_insecure_secret_file is True
    with pytest.raises(ConfigError, match="mode 0640"):  # (false is the default, said or not)
        load_cluster_config(config_with(tmp_path, 'secret_file = "s"\nallow_insecure_secret_file = false'))
    with pytest.raises(ConfigError, match=r"\[cluster\] allow_insecure_secret_file = 'yes': must be true or false"):
        load_cluster_config(config_with(tmp_path, 'secret_file = "s"\nallow_insecure_secret_file = "yes"'))


def test_a_missing_secret_file_falls_back_to_the_environment_else_says_how_to_make_one(tmp_path, monkeypatch):
    p = config_with(tmp_path, 'secret_file = "run/c.secret"')
    monkeypatch.setenv(SECRET_ENV, ENV_SECRET)
    cc = load_cluster_config(p)
    assert (cc.settings.secret, cc.settings.secret_from) == (ENV_SECRET, "environment")
    monkeypatch.delenv(SECRET_ENV)
    with pytest.raises(ConfigError) as exc:
        load_cluster_config(p)
    why = str(exc.value)
    assert f"{p}: [cluster] secret_file = 'run/c.secret': {tmp_path / 'run' / 'c.secret'} does not exist" in why
    assert f"`roost cluster up {p}` creates the file (mode 0600)" in why and SECRET_ENV in why
    (tmp_path / "run").mkdir()
    secret_file(tmp_path / "run" / "c.secret", 0o600)
    monkeypatch.setenv(SECRET_ENV, ENV_SECRET)
    assert load_cluster_config(p).settings.secret == "from-a-file-0123456789"  # (the file, once it exists)


def test_an_inline_secret_stays_allowed_and_says_so(tmp_path, no_env):
    cc = load_cluster_config(config_with(tmp_path, 'secret = "0123456789abcdef"'))
    assert (cc.settings.secret, cc.settings.secret_from) == ("0123456789abcdef", "config")


def test_cluster_up_creates_the_secret_file_once_mode_0600(tmp_path, no_env, monkeypatch):
    p = config_with(tmp_path, 'secret_file = "secrets/c.secret"')
    made = ensure_secret_file(p)
    assert made == tmp_path / "secrets" / "c.secret"
    assert stat.S_IMODE(made.stat().st_mode) == 0o600 and stat.S_IMODE(made.parent.stat().st_mode) == 0o700
    secret = made.read_text()
    assert len(secret.strip()) >= 32 and secret.endswith("\n")
    assert load_cluster_config(p).settings.secret == secret.strip()
    assert ensure_secret_file(p) is None and made.read_text() == secret  # (reused, never rewritten)
    made.unlink()
    monkeypatch.setenv(SECRET_ENV, ENV_SECRET)  # (the environment has one: nothing to make)
    assert ensure_secret_file(p) is None and not made.exists()
    monkeypatch.delenv(SECRET_ENV)
    inline = config_with(tmp_path, 'secret = "0123456789abcdef"')
    assert ensure_secret_file(inline) is None
    inline.write_text(inline.read_text().replace('secret = "0123456789abcdef"', 'secret_file = "secrets/c.secret"'))
    old = os.umask(0o000)  # (whatever the umask: 0600)
    try:
        made = ensure_secret_file(inline)
    finally:
        os.umask(old)
    assert made is not None and stat.S_IMODE(made.stat().st_mode) == 0o600


@pytest.mark.slow
def test_cluster_up_makes_the_secret_and_a_member_started_by_hand_reads_it(tmp_path):
    """Real processes: `up` creates the file (0600) and the members use it; a restart by hand
    (`roost node --config ... --id`) reads the same file; without it and without the
    environment, roost node says what to do."""
    env = {k: v for k, v in os.environ.items() if k != SECRET_ENV}
    p = config_with(tmp_path, 'secret_file = "run/c.secret"')
    made = tmp_path / "run" / "c.secret"
    up = roost("cluster", "up", str(p), "--detach", "--run-dir", str(tmp_path / "r"), env=env, timeout=90)
    try:
        assert up.returncode == 0, up.stderr
        assert f"created the cluster secret {made} (mode 0600)" in up.stdout
        assert up.stdout.count(" ready: clients udp://") == 2
        assert stat.S_IMODE(made.stat().st_mode) == 0o600
        secret = made.read_text()
        kill = roost("cluster", "kill", "n2", "--run-dir", str(tmp_path / "r"), env=env)
        assert kill.returncode == 0, kill.stderr
        start = roost("cluster", "start", "n2", "--run-dir", str(tmp_path / "r"), env=env, timeout=90)
        assert start.returncode == 0, start.stderr  # (n2 read the file and joined n1's links)
        assert made.read_text() == secret
        st = roost("status", "--node", f"127.0.0.1:{load_cluster_config(p).member('n1').client_addr[1]}", "--json",
                   env=env)  # fmt: skip
        assert st.returncode == 0 and '"ready"' in st.stdout
        log = (tmp_path / "r" / "n1.log").read_text()
        assert "secret_in_config" not in log
    finally:
        down = roost("cluster", "down", "--run-dir", str(tmp_path / "r"), env=env)
        assert down.returncode == 0, down.stderr
    made.unlink()
    by_hand = roost("node", "--config", str(p), "--id", "n1", env=env, timeout=30)
    assert by_hand.returncode == 2
    assert f"{made} does not exist and ${SECRET_ENV} is not set" in by_hand.stderr, by_hand.stderr


def test_members_with_an_inline_secret_log_a_warning(tmp_path):
    """Still allowed (tests, quick tries), but said: configs end up in repositories."""
    from tests.clusterkit import LocalCluster

    c = LocalCluster(tmp_path, n=1)
    c.start()
    try:
        line = next(x for x in c.log("n1").splitlines() if "secret_in_config" in x)
        assert " WARNING " in f" {line} " and str(c.config) in line and "secret_file" in line
    finally:
        c.stop()


# ---------------------------------------------------------------- the shipped configs

CONFIGS = sorted(Path(ROOT, "configs").glob("*.toml"))


def test_the_shipped_configs_track_no_secret_and_name_a_file_under_run_or_read_the_environment():
    clusters = 0
    for path in CONFIGS:
        data = tomllib.loads(path.read_text())
        table = data.get("cluster")
        if table is None:
            continue
        clusters += 1
        assert "secret" not in table, path
        assert not re.search(r"secret\s*=\s*\"", path.read_text()), path
        if "secret_file" in table:  # (the compose configs read $ROOST_CLUSTER_SECRET)
            assert table["secret_file"] == f"../run/{path.stem}.secret", path
        load_cluster_config(path, need_secret=False)
    assert clusters == 5


def test_the_shipped_configs_trust_loopback_only_for_the_text_protocol():
    default = next(s.default for s in SETTINGS if s.key == "text_networks")
    for path in CONFIGS:
        nets = tomllib.loads(path.read_text()).get("node", {}).get("text_networks", default)
        assert nets and all(ipaddress.ip_network(n).is_loopback for n in nets), (path, nets)
