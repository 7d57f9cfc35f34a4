"""Where a Redis (or broker) URL comes from, so that its password stays off the command line, and how
one is checked and shown (password masked) before anything connects to it.

A URL given as `--redis redis://:PASSWORD@host` sits in /proc/<pid>/cmdline, readable by every
user of the host. The worker, `vela2 backfill` and `vela2 http` also take it from the environment
(`VELA2_REDIS_URL`) or from a file (`--redis-url-file`, `VELA2_REDIS_URL_FILE`: its first line), and
warn when a password is given in argv. Standard library only (both sides import it).

A Redis Sentinel deployment is named by one URL too, kombu's form with the master's name in the
query: `sentinel://[:PASSWORD@]host1:26379[/DB];sentinel://host2:26379?master_name=NAME` (one
`sentinel://` segment per sentinel, joined by `;`; the password and the db are the master's, given in
any one segment). Sentinels that require a password of their own (`requirepass` in sentinel.conf)
take it as `&sentinel_password=PW` (masked wherever the URL is shown, like the master's).
`parse_sentinel_url` reads it; vela2.wire.connections turns any URL into a client.
"""

from __future__ import annotations

import argparse
import logging
import os
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import parse_qs, quote, unquote, urlsplit, urlunsplit

from vela2.errors import ConfigError
from vela2.wire.keys import AMQP_SCHEMES

ENV_REDIS_URL = "VELA2_REDIS_URL"  # the result store's (and by default the broker's) URL: the worker's variable too
ENV_REDIS_URL_FILE = "VELA2_REDIS_URL_FILE"
# The broker's URL when it is not the result store's (worker.settings declares the worker's setting of
# the same name; the producer commands read this variable).
ENV_BROKER_URL = "VELA2_BROKER_URL"
SENTINEL_SCHEME = "sentinel"
SENTINEL_MASTER_PARAM = "master_name"  # the query parameter naming the Sentinel master (kombu's option name)
SENTINEL_PASSWORD_PARAM = "sentinel_password"  # the sentinels' own password (their requirepass), if they have one
SENTINEL_DEFAULT_PORT = 26379
RESULT_STORE_SCHEMES = ("redis", "rediss", "unix", SENTINEL_SCHEME)
BROKER_SCHEMES = ("redis", "rediss", SENTINEL_SCHEME, *AMQP_SCHEMES)
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
    """Whether `url` carries a password (redis://:pw@..., redis://user:pw@..., ?password=...; any
    segment of a sentinel:// URL)."""
    if ";" in url and is_sentinel_url(url):
        return any(has_password(segment) for segment in url.split(";"))
    try:
        parts = urlsplit(url)
    except ValueError:
        return False
    return bool(parts.password) or "password=" in parts.query


def mask_url(url: str) -> str:
    """`url` as it may be logged: a password in it (user:PASSWORD@, ?password=) replaced by `**` (as kombu shows it),
    in every segment of a sentinel:// URL."""
    if ";" in url and is_sentinel_url(url):
        return ";".join(mask_url(segment) for segment in url.split(";"))
    try:
        parts = urlsplit(url)
        netloc = parts.netloc
        if parts.password:
            userinfo, _, hostport = netloc.rpartition("@")
            user = userinfo.split(":", 1)[0]
            netloc = f"{user}:**@{hostport}"
        query = "&".join((q.split("=", 1)[0] + "=**" if q.split("=", 1)[0] in ("password", SENTINEL_PASSWORD_PARAM)
                          else q) for q in parts.query.split("&"))
        return urlunsplit((parts.scheme, netloc, parts.path, query if parts.query else "", parts.fragment))
    except ValueError:  # not parseable as a URL: show none of it but its scheme
        return url.split(":", 1)[0] + "://***"


def check_url(url: str, what: str, schemes: tuple[str, ...]) -> str:
    """`url` when its scheme is one of `schemes` and it names a host (or, for unix://, a path; for
    sentinel://, hosts and a master name); else ConfigError naming `what` and the URL, password masked."""
    if is_sentinel_url(url) and SENTINEL_SCHEME in schemes:
        parse_sentinel_url(url, what)
        return url
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


def is_sentinel_url(url: str) -> bool:
    """Whether `url` names Redis through Sentinel (`sentinel://...`)."""
    return url.split("://", 1)[0].lower() == SENTINEL_SCHEME


@dataclass(frozen=True)
class SentinelUrl:
    """A sentinel:// URL, read: the sentinels to ask, the master's name, and how to talk to the master."""

    sentinels: tuple[tuple[str, int], ...]  # (host, port) of each sentinel
    master_name: str
    db: int = 0
    username: str | None = None  # the master's (and its replicas') ACL user and password
    password: str | None = field(default=None, repr=False)
    sentinel_password: str | None = field(default=None, repr=False)  # the sentinels' own requirepass

    def sentinel_kwargs(self) -> dict[str, str]:
        """Connection options for the sentinels themselves (redis-py's / kombu's / Celery's
        `sentinel_kwargs`): their password, when they have one."""
        return {"password": self.sentinel_password} if self.sentinel_password else {}

    def kombu_url(self) -> str:
        """The URL as kombu's and Celery's Redis Sentinel transport / backend take it (no query: the
        master name goes in their `master_name` transport option)."""
        auth = f"{quote(self.username or '', safe='')}:{quote(self.password, safe='')}@" if self.password else ""
        return ";".join(f"{SENTINEL_SCHEME}://{auth}{host}:{port}/{self.db}" for host, port in self.sentinels)


def parse_sentinel_url(url: str, what: str = "Redis") -> SentinelUrl:
    """Read a sentinel:// URL (see the module docstring); ConfigError naming `what` and the URL
    (password masked) when it names no sentinel host, no master (`?master_name=`), a bad port or db,
    or two different passwords / dbs / masters."""
    shown = mask_url(url)
    sentinels: list[tuple[str, int]] = []
    found: dict[str, set[str]] = {"master_name": set(), "db": set(), "password": set(), "username": set(),
                                  SENTINEL_PASSWORD_PARAM: set()}
    for segment in url.split(";"):
        if not segment.strip():
            continue
        try:
            parts = urlsplit(segment.strip())
            port = parts.port or SENTINEL_DEFAULT_PORT
        except ValueError as e:
            raise ConfigError(f"the {what} URL {shown!r} is not a valid URL: {e}") from None
        if parts.scheme.lower() != SENTINEL_SCHEME:
            raise ConfigError(f"the {what} URL {shown!r} mixes schemes: every segment must be sentinel://")
        if not parts.hostname:
            raise ConfigError(f"the {what} URL {shown!r} has a segment that names no sentinel host")
        sentinels.append((parts.hostname, port))
        query = {k: v[-1] for k, v in parse_qs(parts.query).items()}
        if query.get(SENTINEL_MASTER_PARAM):
            found["master_name"].add(query[SENTINEL_MASTER_PARAM])
        if query.get(SENTINEL_PASSWORD_PARAM):
            found[SENTINEL_PASSWORD_PARAM].add(query[SENTINEL_PASSWORD_PARAM])
        if parts.password or query.get("password"):
            found["password"].add(unquote(parts.password or "") or query["password"])
        if parts.username:
            found["username"].add(unquote(parts.username))
        if parts.path.strip("/"):
            found["db"].add(parts.path.strip("/"))
    if not sentinels:
        raise ConfigError(f"the {what} URL {shown!r} names no sentinel host")
    for key, values in found.items():
        if len(values) > 1:
            raise ConfigError(f"the {what} URL {shown!r} gives {len(values)} different {key} values; give one")
    if not found["master_name"]:
        raise ConfigError(f"the {what} URL {shown!r} names no master: add ?{SENTINEL_MASTER_PARAM}=NAME "
                          "(the name the sentinels monitor)")
    db = next(iter(found["db"]), "0")
    if not db.isdigit():
        raise ConfigError(f"the {what} URL {shown!r} has db {db!r}; expected a number")
    return SentinelUrl(tuple(sentinels), found["master_name"].pop(), int(db),
                       next(iter(found["username"]), None) or None, next(iter(found["password"]), None),
                       next(iter(found[SENTINEL_PASSWORD_PARAM]), None))


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
