"""kombu's Redis transport, made safe for a fleet: no queue item can kill a worker, and no message
is lost when Redis refuses writes (full under noeviction) or goes away mid-delivery.

- Every item BRPOP hands over is looked at first (vela2.wire.messages.triage): anything that is not
  a protocol-2 message of ours (not JSON, nested too deep, headers not an object, another task,
  protocol 1, an unknown body encoding...) is wrapped so the engine answers the ids found in it or
  dead-letters it, acking only after that is stored. Celery's built-in tasks are never run.
- Recording a taken message in kombu's `unacked` hash is retried until Redis accepts it: a
  message BRPOP took is then in neither the queue nor `unacked` only in this process's memory,
  for as long as Redis refuses the write (full, or restarting) — never dropped. While it waits the
  worker logs once per interval and the metric `vela2_redis_write_blocked_seconds` says how long it
  has waited (worker.retry).
- The periodic restore of timed-out messages is skipped while Redis refuses writes (it takes a
  lock with SET NX), instead of stopping the worker; binding a queue at start-up waits like a write.
"""

from __future__ import annotations

import logging
from typing import Any
from urllib.parse import parse_qs, urlsplit

from kombu.transport import redis as kombu_redis
from kombu.utils.encoding import bytes_to_str

from vela2.wire import messages
from worker.retry import BLOCKED, RETRY_ERRORS, until_written

log = logging.getLogger(__name__)

class TolerantQoS(kombu_redis.QoS):
    """kombu's QoS with the unacked write retried and the restore sweep skipped while refused."""

    def append(self, message: Any, delivery_tag: str) -> None:
        until_written(lambda: super(TolerantQoS, self).append(message, delivery_tag),
                      f"recording delivery {delivery_tag} in unacked")

    def restore_visible(self, *args: Any, **kwargs: Any) -> None:
        try:
            super().restore_visible(*args, **kwargs)
        except RETRY_ERRORS as e:  # the next sweep tries again
            BLOCKED.refused("restoring timed-out messages", e)


class TolerantChannel(kombu_redis.Channel):
    """kombu's Redis channel with every queue item triaged before kombu parses it."""

    QoS = TolerantQoS

    def _brpop_read(self, **options: Any) -> bool:
        # kombu's own _brpop_read (5.7), with vela2.wire.messages.triage in place of its bare loads()
        try:
            try:
                dest__item = self.client.parse_response(self.client.connection, "BRPOP", **options)
            except self.connection_errors:
                self.client.connection.disconnect()
                raise
            if not dest__item:
                raise kombu_redis.Empty()
            dest, item = dest__item
            dest = bytes_to_str(dest).rsplit(self.sep, 1)[0]
            self._queue_cycle.rotate(dest)
            checked = messages.triage(item, dest)
            if checked.refused is not None:
                log.warning("queue item on %s refused: %s", dest, checked.refused)
            self.connection._deliver(checked.envelope, dest)
            return True
        finally:
            self._in_poll = None  # type: ignore[assignment]  # as kombu resets it
            flush = getattr(self, "_flush_brpop_reauth", None)
            if flush is not None:
                flush()

    def _queue_bind(self, exchange: str, routing_key: str, pattern: str, queue: str) -> None:
        until_written(lambda: super(TolerantChannel, self)._queue_bind(exchange, routing_key, pattern, queue),
                      f"binding queue {queue}")

    def _size(self, queue: str) -> int:
        # a MULTI of LLENs, which Redis refuses while full
        return until_written(lambda: super(TolerantChannel, self)._size(queue), f"sizing queue {queue}")

    def _put(self, queue: str, message: Any, **kwargs: Any) -> None:
        until_written(lambda: super(TolerantChannel, self)._put(queue, message, **kwargs), f"queueing on {queue}")


class RedisTransport(kombu_redis.Transport):
    """kombu's Redis transport with the tolerant channel (redis:// and rediss:// broker URLs)."""

    Channel = TolerantChannel


def ssl_options(url: str) -> dict[str, Any] | None:
    """For a rediss:// URL, the SSL options kombu needs when the transport is given explicitly
    (the URL's ssl_* query parameters; certificates required unless ssl_cert_reqs says otherwise)."""
    parts = urlsplit(url)
    if parts.scheme != "rediss":
        return None
    import ssl

    query = {k: v[-1] for k, v in parse_qs(parts.query).items()}
    reqs = {"required": ssl.CERT_REQUIRED, "optional": ssl.CERT_OPTIONAL, "none": ssl.CERT_NONE}
    opts: dict[str, Any] = {"ssl_cert_reqs": reqs.get(query.get("ssl_cert_reqs", "required").lower(),
                                                      ssl.CERT_REQUIRED)}
    for key in ("ssl_ca_certs", "ssl_certfile", "ssl_keyfile"):
        if key in query:
            opts[key] = query[key]
    return opts
