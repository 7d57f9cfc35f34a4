"""Every kombu and Celery internal the worker overrides or relies on, in one place, with what we rely
on: a method's parameters, or the names its source must use (the protocol our override repeats).
The worker checks them at start (worker.runtime.checks.preflight) and refuses to run, naming the
internal, when the installed kombu or Celery changed one; a test checks them against the pinned
versions. Where used:

- worker.transport.redis: kombu's Redis channel taking by our script (`_brpop_start` /
  `_brpop_read` replaced, `_get`, `_restore`, `_queue_bind`, `_size`, `_put`,
  `maybe_refresh_binding_expiry` wrapped), its QoS over our held records;
- worker.transport.amqp: Celery's consumer with every delivery triaged (`create_task_handler`,
  `on_decode_error`);
- worker.app: the `vela2.score` task's Strategy (Celery instantiates it with (task, app, consumer)
  and calls its handler as the default strategy's, with ack / reject bound to the message's
  `ack_log_error` / `reject_log_error`).
"""

from __future__ import annotations

import importlib
import inspect
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Internal:
    """One internal: `path` (module:attribute.chain); `params`, the parameter names its signature
    must have (None: not checked); `uses`, names its source must mention."""

    path: str
    params: tuple[str, ...] | None = None
    uses: tuple[str, ...] = ()


REDIS = "kombu.transport.redis"
INTERNALS = (
    Internal(f"{REDIS}:Channel._brpop_start", ("self", "timeout"),
             uses=("_queue_cycle.consume", "active_queues", "_q_for_pri", "priority_steps", "_in_poll",
                   "_brpop_sent_at", "send_command")),
    Internal(f"{REDIS}:Channel._brpop_read", ("self", "options"),
             uses=("parse_response", "connection_errors", "_deliver", "_in_poll", "_flush_brpop_reauth")),
    Internal(f"{REDIS}:Channel._get", ("self", "queue")),
    Internal(f"{REDIS}:Channel._restore", ("self", "message", "leftmost")),
    Internal(f"{REDIS}:Channel._queue_bind", ("self", "exchange", "routing_key", "pattern", "queue")),
    Internal(f"{REDIS}:Channel._size", ("self", "queue")),
    Internal(f"{REDIS}:Channel._put", ("self", "queue", "message", "kwargs")),
    Internal(f"{REDIS}:Channel._q_for_pri", ("self", "queue", "pri")),
    Internal(f"{REDIS}:Channel.maybe_refresh_binding_expiry", ("self",)),
    Internal(f"{REDIS}:Channel.conn_or_acquire", ("self", "client")),
    Internal(f"{REDIS}:Channel.priority_steps"),
    Internal(f"{REDIS}:Channel.sep"),
    Internal(f"{REDIS}:Channel.__init__", uses=("brpop_timeout", "_queue_cycle")),
    Internal(f"{REDIS}:QoS.append", ("self", "message", "delivery_tag")),
    Internal(f"{REDIS}:QoS.ack", ("self", "delivery_tag")),
    Internal(f"{REDIS}:QoS.restore_by_tag", ("self", "tag", "client", "leftmost")),
    Internal(f"{REDIS}:QoS.restore_visible", ("self", "start", "num", "interval")),
    Internal(f"{REDIS}:QoS.can_consume_max_estimate", ("self",)),
    Internal(f"{REDIS}:QoS.unacked_key"),
    Internal(f"{REDIS}:QoS.unacked_index_key"),
    Internal(f"{REDIS}:Empty"),
    Internal(f"{REDIS}:Transport.Channel"),
    Internal(f"{REDIS}:SentinelChannel"),
    Internal(f"{REDIS}:SentinelTransport.Channel"),
    Internal("kombu.transport.virtual:QoS.append", ("self", "message", "delivery_tag")),
    Internal("kombu.transport.virtual:QoS.ack", ("self", "delivery_tag")),
    Internal("kombu.transport.virtual:Transport._deliver", ("self", "message", "queue")),
    Internal("kombu.message:Message.ack_log_error", ("self", "logger", "errors", "multiple")),
    Internal("kombu.message:Message.reject_log_error", ("self", "logger", "errors", "requeue")),
    Internal("celery.worker.consumer:Consumer.create_task_handler", ("self", "promise"),
             uses=("ack_log_error", "reject_log_error", "strategy")),
    Internal("celery.worker.consumer:Consumer.on_decode_error", ("self", "message", "exc")),
    Internal("celery.app.task:Task.start_strategy", ("self", "app", "consumer", "kwargs"),
             uses=("self.Strategy",)),
)


def _resolve(path: str) -> Any:
    module, _, chain = path.partition(":")
    obj: Any = importlib.import_module(module)
    for name in chain.split("."):
        obj = inspect.getattr_static(obj, name) if isinstance(obj, type) else getattr(obj, name)
    return obj


def problem(internal: Internal) -> str | None:
    """What changed about one internal in the installed versions (None: as we rely on it)."""
    try:
        obj = _resolve(internal.path)
    except (ImportError, AttributeError):
        return f"{internal.path} is gone"
    func = obj.__func__ if isinstance(obj, (staticmethod, classmethod)) else obj
    if internal.params is not None:
        try:
            got = tuple(inspect.signature(func).parameters)
        except (TypeError, ValueError):
            return f"{internal.path} is no longer a function"
        if got != internal.params:
            return f"{internal.path} takes ({', '.join(got)}), not ({', '.join(internal.params)})"
    if internal.uses:
        source = inspect.getsource(func)
        missing = [name for name in internal.uses if name not in source]
        if missing:
            return f"{internal.path} no longer uses {', '.join(missing)}"
    return None


def problems() -> list[str]:
    """One line per internal that the installed kombu / Celery changed, naming it and their versions."""
    found = [p for p in (problem(i) for i in INTERNALS) if p is not None]
    if not found:
        return []
    import celery
    import kombu

    where = f"(kombu {kombu.__version__}, celery {celery.__version__})"
    return [f"{p} {where}" for p in found]
