"""What a worker checks before it serves, so that `vela2 worker` fails fast with one clear line:
the settings, the result store and the broker (reachable, credentials accepted, new enough, enough
replicas), no live worker serving the model from another checkpoint, and the visibility rule.

The visibility rule: kombu's Redis transport hands an unacked message to another worker once its
delivery is older than the visibility timeout. The worker renews the delivery of every message it
holds while its engine makes progress (worker.runtime.leases: every quarter of the timeout), so a
message held behind a deep buffer or a request of thousands of windows is never handed out twice;
the engine counts as stalled (and stops renewing) after a whole timeout without a turn or a batch.
So one batch must fit in the timeout with room to spare: the worker measures its worst batch (a full
`max_batch_tokens` of its longest windows) at start and refuses a visibility timeout shorter than
max(MIN_VISIBILITY_S, max_wait + 4 x worst batch).
"""

from __future__ import annotations

import logging
import sys
import time
from typing import Any

from kombu.utils.url import maybe_sanitize_url

from vela2.errors import ConfigError
from vela2.wire import fleet, keys, taking
from vela2.wire.connections import redis_client
from vela2.wire.urls import SENTINEL_PASSWORD_PARAM, mask_url, warn_if_password_in_argv
from worker.settings import WorkerSettings, env_name
from worker.transport import internals

log = logging.getLogger(__name__)

_AUTH_TRIES = 3  # a refused password is tried this often (a rotation in progress), then it is final


def preflight(settings: WorkerSettings) -> None:
    """What can be checked before Celery starts, so `vela2 worker` fails fast with one clear line:
    the settings (URL schemes included), the checkpoint's config, and the result store and the broker
    (each reachable within redis_wait_s, and the password accepted); warns when a password sits in
    argv. Raises ConfigError / CheckpointError."""
    warn_if_password_in_argv(sys.argv[1:], log)
    changed = internals.problems()
    if changed:
        raise ConfigError(f"the installed kombu / Celery changed an internal the worker relies on "
                          f"(worker.transport.internals): {changed[0]}; install the versions of constraints.txt")
    settings.validate()
    settings.resolved_model_name()  # reads the checkpoint's config.json
    check_redis(settings.redis_url, settings.redis_wait_s, "result store", replicas=settings.engine.wait_replicas)
    if keys.is_amqp_url(settings.resolved_broker_url):
        check_amqp(settings.resolved_broker_url, settings.redis_wait_s)
    elif settings.resolved_broker_url != settings.redis_url:
        check_redis(settings.resolved_broker_url, settings.redis_wait_s, "broker")


def check_amqp(url: str, wait_s: float) -> None:
    """Connect to RabbitMQ at `url`: wait up to `wait_s` for it to answer, but fail at once when it
    refuses the credentials or the vhost (ConfigError naming the URL, password masked)."""
    import amqp.exceptions
    from kombu import Connection

    where = f"RabbitMQ at {maybe_sanitize_url(url)} (broker)"
    deadline = time.monotonic() + wait_s
    last_log = 0.0
    while True:
        conn = Connection(url, connect_timeout=2)
        try:
            conn.connect()
            return
        except (amqp.exceptions.AccessRefused, amqp.exceptions.NotAllowed) as e:
            raise ConfigError(f"{where} refuses the credentials or the vhost: {e}") from None
        except (OSError, amqp.exceptions.AMQPError) as e:  # refused, reset, timed out: not up yet
            if time.monotonic() >= deadline:
                raise ConfigError(f"{where} did not answer within {wait_s:g} s (redis_wait_s): {e}") from None
            if time.monotonic() - last_log >= 10:
                last_log = time.monotonic()
                log.warning("waiting for %s: %s", where, e)
        finally:
            conn.release()
        time.sleep(0.3)


def check_redis(url: str, wait_s: float, role: str = "result store", replicas: int = 0) -> None:
    """PING the Redis that serves as `role` (named in every error, with its URL): wait up to `wait_s`
    for it to answer (it may start after the worker), but fail at once (after a few quick tries) when
    it refuses the credentials, and when it is older than the queues need (vela2.wire.taking.MIN_REDIS_VERSION).
    `replicas` (settings.wait_replicas): also wait, within the same `wait_s`, until that many replicas
    are connected to it, else fail: a worker that acks only once N replicas hold its results would
    otherwise score, store and never ack."""
    client = redis_client(url, socket_connect_timeout=2, socket_timeout=5)
    deadline = time.monotonic() + wait_s
    where = f"Redis at {mask_url(url)} ({role})"
    auth_tries = 0
    last_log = 0.0
    try:
        while True:
            kind, detail = _look_at_redis(client, replicas, url, role)
            if kind == "ready":
                return
            if kind == "refused":
                auth_tries += 1
                if auth_tries >= _AUTH_TRIES:
                    raise ConfigError(f"{where}{detail}")
            elif time.monotonic() >= deadline:
                raise ConfigError(f"{where} did not answer within {wait_s:g} s (redis_wait_s): {detail}"
                                  if kind == "down" else f"{where} {detail} (waited {wait_s:g} s, redis_wait_s)")
            elif time.monotonic() - last_log >= 10:
                last_log = time.monotonic()
                log.warning("waiting for the %s Redis at %s: %s", role, mask_url(url), detail)
            time.sleep(0.3)
    finally:
        client.close()


def _look_at_redis(client: Any, replicas: int, url: str, role: str) -> tuple[str, str]:
    """One look at a Redis: ("ready", ""), ("down" | "replicas", why to keep waiting) or ("refused",
    why the credentials are refused). Raises ConfigError for what waiting cannot mend: too old, an
    error answer."""
    import redis
    from redis.sentinel import MasterNotFoundError

    try:
        client.ping()
        try:
            version = str(client.info("server").get("redis_version", ""))
        except redis.exceptions.ResponseError:  # a Redis-compatible server without INFO
            version = ""
        problem = taking.version_problem(version)
        if problem:
            raise ConfigError(f"{problem} (at {mask_url(url)}, {role})")
        have = _online_replicas(client) if replicas else 0
        if have < replicas:
            return "replicas", (f"has {have} replicas connected, and wait_replicas is {replicas}: none of its "
                                "results could be acked")
        return "ready", ""
    except (redis.exceptions.AuthenticationError, redis.exceptions.AuthorizationError,
            redis.exceptions.NoPermissionError) as e:
        return "refused", f" refuses the credentials: {e}"
    except redis.exceptions.ResponseError as e:
        refused = "NOAUTH" in str(e) or "WRONGPASS" in str(e)
        what = "refuses the credentials" if refused else "answers PING with an error"
        raise ConfigError(f"Redis at {mask_url(url)} ({role}) {what}: {e}") from None
    except (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError,
            redis.exceptions.BusyLoadingError) as e:
        # sentinel://: no sentinel named the master, because they want a password (of their own)
        if isinstance(e, MasterNotFoundError) and any(
                mark in str(e) for mark in ("AuthenticationError", "NOAUTH", "WRONGPASS")):
            return "refused", (": the sentinels refuse the credentials (a password of their own goes in the URL "
                               f"as &{SENTINEL_PASSWORD_PARAM}=PW)")
        return "down", str(e)


def _online_replicas(client: Any) -> int:
    """How many replicas are connected to the Redis of `client` and online (INFO replication's
    slaveN lines, `state=online`); 0 where INFO is refused."""
    import redis

    try:
        info = client.info("replication")
    except redis.exceptions.ResponseError:
        return 0
    return sum(1 for k, v in info.items()
               if k.startswith("slave") and isinstance(v, dict) and v.get("state") == "online")


def check_mixed(client: Any, model_name: str, digest: str, allow: bool) -> None:
    """Refuse to start (ConfigError) while another live worker serves `model_name` from a checkpoint
    with another digest: its answers and ours would differ under one name. `allow` (allow_mixed, a
    rolling upgrade): only a warning."""
    others = fleet.other_digests(client, model_name, digest)
    if not others:
        return
    listed = ", ".join(f"{w} ({d[:12]})" for w, d in sorted(others.items()))
    if allow:
        log.warning("serving %s from checkpoint %s beside live workers with other checkpoints: %s (allow_mixed)",
                    model_name, digest[:12], listed)
        return
    raise ConfigError(f"live workers serve {model_name} from other checkpoints: {listed}; this one is "
                      f"{digest[:12]}. Stop them, serve under another model name, or pass --allow-mixed 1 "
                      f"({env_name('allow_mixed')}=1) for a rolling upgrade")


MIN_VISIBILITY_S = 5.0  # below this the leases' renewals (a quarter of it) leave no room for a slow Redis


def required_visibility_s(max_wait_ms: float, worst_batch_s: float) -> float:
    """The least visibility timeout: max(MIN_VISIBILITY_S, max_wait + 4 x worst batch)."""
    return max(MIN_VISIBILITY_S, max_wait_ms / 1e3 + 4 * worst_batch_s)


def check_visibility(visibility_timeout_s: float, max_wait_ms: float, worst_batch_s: float) -> None:
    """Refuse to start (ConfigError) when one batch could keep the engine from progressing for a
    whole visibility timeout (its leases would stop and its messages go to another worker)."""
    need = required_visibility_s(max_wait_ms, worst_batch_s)
    if visibility_timeout_s < need:
        raise ConfigError(
            f"visibility timeout {visibility_timeout_s:g} s is too short: it must be at least "
            f"max({MIN_VISIBILITY_S:g} s, max_wait {max_wait_ms / 1e3:g} s + 4 x worst batch {worst_batch_s:.3f} s)"
            f" = {need:.1f} s; raise --visibility-timeout-s, or lower --max-batch-tokens"
        )
