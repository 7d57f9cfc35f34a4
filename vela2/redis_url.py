"""Where a Redis URL comes from, so that its password stays off the command line.

A URL given as `--redis redis://:PASSWORD@host` sits in /proc/<pid>/cmdline, readable by every
user of the host. The worker, `vela2 backfill` and `vela2 http` also take it from the environment
(`VELA2_REDIS_URL`) or from a file (`--redis-url-file`, `VELA2_REDIS_URL_FILE`: its first line), and
warn when a password is given in argv. Standard library only (both sides import it).
"""

from __future__ import annotations

import logging
from pathlib import Path
from urllib.parse import urlsplit

from vela2.errors import ConfigError

ENV_REDIS_URL_FILE = "VELA2_REDIS_URL_FILE"
PASSWORD_IN_ARGV = ("a Redis password is given on the command line, where every user of this host can read it "
                    "(/proc/<pid>/cmdline); pass the URL in VELA2_REDIS_URL or a file (--redis-url-file)")


def read_url_file(path: str | Path) -> str:
    """The Redis URL in the first line of `path`; raises ConfigError when it is missing or empty."""
    try:
        lines = Path(path).read_text(encoding="utf-8").splitlines()
    except OSError as e:
        raise ConfigError(f"cannot read the Redis URL file {str(path)!r}: {e.strerror or e}") from None
    url = lines[0].strip() if lines else ""
    if not url:
        raise ConfigError(f"the Redis URL file {str(path)!r} is empty")
    return url


def has_password(url: str) -> bool:
    """Whether `url` carries a password (redis://:pw@..., redis://user:pw@..., ?password=...)."""
    try:
        parts = urlsplit(url)
    except ValueError:
        return False
    return bool(parts.password) or "password=" in parts.query


_warned: set[tuple[str, ...]] = set()


def warn_if_password_in_argv(argv: list[str], logger: logging.Logger) -> bool:
    """Log PASSWORD_IN_ARGV (once per argv) when an argument holds a Redis URL with a password;
    returns whether one does."""
    found = any(has_password(a.split("=", 1)[1] if a.startswith("--") and "=" in a else a)
                for a in argv if "://" in a)
    if found and tuple(argv) not in _warned:
        _warned.add(tuple(argv))
        logger.warning(PASSWORD_IN_ARGV)
    return found


def url_from_args(url: str, url_file: str | None, argv: list[str], logger: logging.Logger) -> str:
    """The Redis URL a producer command uses: the file's (when given) over the flag / environment
    value; warns when argv holds a password."""
    warn_if_password_in_argv(argv, logger)
    return read_url_file(url_file) if url_file else url
