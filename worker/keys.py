"""Every Redis key, queue and task name the worker and the producer use, in one place.

Standard library only: the producer imports this module without celery or torch.
"""

from __future__ import annotations

TASK_NAME = "vela2.score"  # the Celery task name of every scoring message
RESULT_PREFIX = "celery-task-meta-"  # Celery's Redis result backend prefix: AsyncResult(id) reads it
CHUNK_PREFIX = "chunk-"  # message id of a bulk chunk; each row is answered under its own id
QUEUE_PREFIX = "vela2."
BACKFILL_SUFFIX = ".backfill"

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


def dead_queue(model_name: str) -> str:
    """The dead-letter list of a model (reserved for messages no worker can decode)."""
    return f"{QUEUE_PREFIX}{model_name}.dead"


def queues(model_name: str) -> list[str]:
    """The queues a worker of `model_name` consumes, highest priority first."""
    return [online_queue(model_name), backfill_queue(model_name)]


def chunk_id(uuid_hex: str) -> str:
    """The message id of a bulk chunk."""
    return CHUNK_PREFIX + uuid_hex


def is_chunk_id(message_id: str) -> bool:
    """True for the id of a bulk chunk message."""
    return message_id.startswith(CHUNK_PREFIX)
