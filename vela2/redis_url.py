"""Where a Redis (or broker) URL comes from, so that its password stays off the command line, and how
one is checked and shown (password masked) before anything connects to it.

A URL given as `--redis redis://:PASSWORD@host` sits in /proc/<pid>/cmdline, readable by every
user of the host. The worker, `vela2 backfill` and `vela2 http` also take it from the environment
(`VELA2_REDIS_URL`) or from a file (`--redis-url-file`, `VELA2_REDIS_URL_FILE`: its first line), and
warn when a password is given in argv. Standard library only (both sides import it).
"""

from __future__ import annotations

import argparse
import logging
import os
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

from vela2.errors import ConfigError
from vela2.wire.keys import AMQP_SCHEMES

ENV_REDIS_URL = "VELA2_REDIS_URL"  # the result store's (and by default the broker's) URL: the worker's variable too
ENV_REDIS_URL_FILE = "VELA2_REDIS_URL_FILE"
# The broker's URL when it is not the result store's (worker.settings declares the worker's setting of
# the same name; the producer commands read this variable).
ENV_BROKER_URL = "VELA2_BROKER_URL"
RESULT_STORE_SCHEMES = ("redis", "rediss", "unix")
BROKER_SCHEMES = ("redis", "rediss", *AMQP_SCHEMES)
PASSWORD_IN_ARGV = ("a Redis password is given on the command line, where every user of this host can read it "
                    "(/proc/<pid>/cmdline); pass the URL in VELA2_REDIS_URL or a file (--redis-url-file)")


def add_url_arguments(parser: argparse.ArgumentParser, default_url: str) -> None:
    """`--redis` and `--redis-url-file`, as every producer command takes them (defaults from
    ENV_REDIS_URL / ENV_REDIS_URL_FILE); resolve them with `url_from_args`."""
    parser.add_argument("--redis", default=os.environ.get(ENV_REDIS_URL, default_url),
                        help=f"Redis URL (default ${ENV_REDIS_URL}; a password here is visible to every user of "
                             "the host)")
    parser.add_argument("--redis-url-file", default=os.environ.get(ENV_REDIS_URL_FILE) or None,
                        help=f"read the Redis URL from this file's first line (or ${ENV_REDIS_URL_FILE})")


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


def mask_url(url: str) -> str:
    """`url` as it may be logged: a password in it (user:PASSWORD@, ?password=) replaced by `**` (as kombu shows it)."""
    try:
        parts = urlsplit(url)
        netloc = parts.netloc
        if parts.password:
            userinfo, _, hostport = netloc.rpartition("@")
            user = userinfo.split(":", 1)[0]
            netloc = f"{user}:**@{hostport}"
        query = "&".join(("password=**" if q.startswith("password=") else q) for q in parts.query.split("&"))
        return urlunsplit((parts.scheme, netloc, parts.path, query if parts.query else "", parts.fragment))
    except ValueError:  # not parseable as a URL: show none of it but its scheme
        return url.split(":", 1)[0] + "://***"


def check_url(url: str, what: str, schemes: tuple[str, ...]) -> str:
    """`url` when its scheme is one of `schemes` and it names a host (or, for unix://, a path); else
    ConfigError naming `what` and the URL, password masked."""
    try:
        parts = urlsplit(url)
        host_ok = bool(parts.path) if parts.scheme == "unix" else bool(parts.hostname)
        parts.port  # noqa: B018 (raises ValueError on a bad port)
    except ValueError as e:
        raise ConfigError(f"the {what} URL {mask_url(url)!r} is not a valid URL: {e}") from None
    if parts.scheme not in schemes:
        raise ConfigError(f"the {what} URL {mask_url(url)!r} has scheme {parts.scheme or '(none)'!r}; "
                          f"expected one of {', '.join(s + '://' for s in schemes)}")
    if not host_ok:
        raise ConfigError(f"the {what} URL {mask_url(url)!r} names no host")
    return url


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
