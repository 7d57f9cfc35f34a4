"""Every Redis key, queue and task name the worker and the producer use, in one place.

Standard library only: the producer imports this module without celery or torch.
"""

from __future__ import annotations

TASK_NAME = "vela2.score"  # the Celery task name of every scoring message
RESULT_PREFIX = "celery-task-meta-"  # Celery's Redis result backend prefix: AsyncResult(id) reads it
CHUNK_PREFIX = "chunk-"  # message id of a bulk chunk; each row is answered under its own id
QUEUE_PREFIX = "vela2."
BACKFILL_SUFFIX = ".backfill"
DEAD_SUFFIX = ".dead"
ATTEMPTS_PREFIX = "vela2:attempts:"  # INCR per delivery that starts running a request; deleted once answered

# kombu's Redis transport keeps delivered, not yet acknowledged messages here (its defaults).
UNACKED_KEY = "unacked"
UNACKED_INDEX_KEY = "unacked_index"


def result_key(request_id: str) -> str:
    """The key (and pub/sub channel) of one request's result: `celery-task-meta-<id>`."""
    return RESULT_PREFIX + request_id


def online_queue(model_name: str) -> str:
    """The queue of interactive requests for a model, drained before its backfill queue."""
    return f"{QUEUE_PREFIX}{model_name}"


def backfill_queue(model_name: str) -> str:
    """The lower-priority queue of bulk requests for a model."""
    return f"{QUEUE_PREFIX}{model_name}{BACKFILL_SUFFIX}"


def dead_letter(model_name: str) -> str:
    """The dead-letter list of a model: a JSON entry per poison request (one that was running each
    time a worker died, max_attempts times), newest first. Not a queue any worker consumes."""
    return f"{QUEUE_PREFIX}{model_name}{DEAD_SUFFIX}"


dead_queue = dead_letter  # the earlier name


def attempts_key(request_id: str) -> str:
    """The counter of deliveries in which a request started running (`vela2:attempts:<id>`)."""
    return ATTEMPTS_PREFIX + request_id


def queues(model_name: str) -> list[str]:
    """The queues a worker of `model_name` consumes, highest priority first."""
    return [online_queue(model_name), backfill_queue(model_name)]


def chunk_id(uuid_hex: str) -> str:
    """The message id of a bulk chunk."""
    return CHUNK_PREFIX + uuid_hex


def is_chunk_id(message_id: str) -> bool:
    """True for the id of a bulk chunk message."""
    return message_id.startswith(CHUNK_PREFIX)
