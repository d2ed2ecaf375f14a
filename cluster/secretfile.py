"""Where a cluster's secret comes from, and the secret file `roost cluster up` creates.

The secret proves to each member that a peer is one of the cluster (cluster/links.py); whoever
holds it can join the cluster's links and push subscriptions for any address. It comes from, in
this order:

1. ``[cluster] secret`` in the config: allowed, for tests and quick tries, but the member logs a
   warning (``secret_in_config``), since configs end up in repositories and tickets;
2. the file ``[cluster] secret_file`` names (its first line; relative to the config's
   directory): refused when group or others may read or change it (any of the mode bits 077),
   unless ``allow_insecure_secret_file = true``. A file that does not exist falls back to
3. the environment variable ``ROOST_CLUSTER_SECRET``.

`roost cluster up` starts every member on this machine, so it may make the secret itself: when
the config names a ``secret_file`` that does not exist and the environment has no secret, it
writes one (``secrets.token_urlsafe``, mode 0600) before it starts them, and every later start
(``cluster start``, ``roost node --config ... --id ...`` by hand) reads the same file.
"""

from __future__ import annotations

import os
import secrets
import stat
from pathlib import Path
from typing import Any, Protocol

from roost.node.config import ConfigError, read_toml

SECRET_ENV = "ROOST_CLUSTER_SECRET"
MIN_LEN = 16


class SecretSettings(Protocol):
    secret: str
    secret_file: str
    allow_insecure_secret_file: bool


def secret_path(source: str | Path, secret_file: str) -> Path:
    """The file ``secret_file`` names: relative paths are relative to the config's directory."""
    p = Path(secret_file)
    return p if p.is_absolute() else Path(source).parent / p


def shown(path: Path) -> str:
    """The path as messages name it: ``configs/../run/x.secret`` is ``run/x.secret`` (only
    shown so: the kernel resolves ``..`` after a symbolic link, normpath does not)."""
    return os.path.normpath(path)


def read_secret(source: str, settings: SecretSettings) -> tuple[str, str]:
    """The cluster secret and where it came from (``"config"``, ``"file"`` or ``"environment"``);
    ConfigError naming the file, the key and what to do when there is none that may be used."""
    if settings.secret and settings.secret_file:
        raise ConfigError(f"{source}: [cluster] secret and secret_file: set one of them, not both")
    if settings.secret:
        return settings.secret, "config"
    env = os.environ.get(SECRET_ENV, "")
    if settings.secret_file:
        key = f"[cluster] secret_file = {settings.secret_file!r}"
        path = secret_path(source, settings.secret_file)
        name = shown(path)
        try:
            secret = _read_private(path, settings.allow_insecure_secret_file)
        except FileNotFoundError:
            if not env:
                raise ConfigError(f"{source}: {key}: {name} does not exist and ${SECRET_ENV} is not set: "
                                  f"`roost cluster up {source}` creates the file (mode 0600), or set "
                                  f"${SECRET_ENV} (a string of at least {MIN_LEN} characters)") from None  # fmt: skip
            secret, key, where = env, f"${SECRET_ENV} (as {name} does not exist)", "environment"
        except _TooOpen as exc:
            raise ConfigError(f"{source}: {key}: {name} has mode {exc.mode:04o}, so group or others may read or "
                              f"change it: run `chmod 600 {name}` (its owner only), or set allow_insecure_secret_file "
                              "= true in [cluster] if it must stay so") from None  # fmt: skip
        except (OSError, ValueError) as exc:  # (UnicodeDecodeError; a NUL in the path: "embedded null byte")
            why = getattr(exc, "strerror", None) or str(exc)
            raise ConfigError(f"{source}: {key}: cannot read {name}: {why}") from None
        else:
            where = "file"
    elif env:
        secret, key, where = env, f"${SECRET_ENV}", "environment"
    else:
        raise ConfigError(f"{source}: [cluster] secret (or secret_file, or ${SECRET_ENV}): required, a string of "
                          f"at least {MIN_LEN} characters")  # fmt: skip
    if len(secret) < MIN_LEN:
        raise ConfigError(f"{source}: {key}: the secret must be a string of at least {MIN_LEN} characters "
                          f"(it has {len(secret)})")  # fmt: skip
    return secret, where


class _TooOpen(Exception):
    def __init__(self, mode: int) -> None:
        self.mode = mode


def _read_private(path: Path, insecure_ok: bool) -> str:
    """The file's first line, stripped; _TooOpen when its mode lets group or others in. The
    mode is that of the file opened (fstat), not of a path that might be swapped meanwhile."""
    with open(path, "rb") as f:
        mode = stat.S_IMODE(os.fstat(f.fileno()).st_mode)
        if mode & 0o077 and not insecure_ok:
            raise _TooOpen(mode)
        lines = f.read().decode().splitlines()
    return lines[0].strip() if lines else ""


def ensure_secret_file(config: str | Path) -> Path | None:
    """`roost cluster up`: create the file the config's ``[cluster] secret_file`` names, with a new
    random secret and mode 0600, when neither it nor ``$ROOST_CLUSTER_SECRET`` exists (a config
    with an inline secret, or none of the two keys, is left alone). Returns the file created, or
    None. Directories it needs are created with mode 0700."""
    data = read_toml(config)
    table: Any = data.get("cluster", {})
    if not isinstance(table, dict):
        return None  # (load_cluster_config says what is wrong)
    name = table.get("secret_file")
    if not isinstance(name, str) or not name or table.get("secret") or os.environ.get(SECRET_ENV):
        return None
    path = secret_path(config, name)
    if os.path.lexists(path):
        return None
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)  # (two at once: one creates it)
    except FileExistsError:
        return None
    except OSError as exc:
        raise ConfigError(f"{config}: [cluster] secret_file = {name!r}: cannot create {shown(path)}: "
                          f"{exc.strerror or exc}") from None  # fmt: skip
    with os.fdopen(fd, "w") as f:
        os.fchmod(f.fileno(), 0o600)  # (whatever the umask)
        f.write(secrets.token_urlsafe(32) + "\n")
        f.flush()
        os.fsync(f.fileno())
    return path
