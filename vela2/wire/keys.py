"""Every Redis key, queue and task name that producers and workers use, in one place."""

from __future__ import annotations

import re

from vela2.config import LIMITS

TASK_NAME = "vela2.score"  # the Celery task name of every scoring message
RESULT_PREFIX = "celery-task-meta-"  # Celery's Redis result backend prefix: AsyncResult(id) reads it
CHUNK_PREFIX = "chunk-"  # message id of a bulk chunk; each row is answered under its own id
QUEUE_PREFIX = "vela2."
BACKFILL_SUFFIX = ".backfill"
DEAD_SUFFIX = ".dead"
ATTEMPTS_PREFIX = "vela2:attempts:"  # INCR per delivery that starts running a request; deleted once answered
SUBMITTED_PREFIX = "vela2:submitted:"  # a marker a tracking client sets at submit time ("<queue> <digest>")
WORKERS_PREFIX = "vela2:workers:"  # a sorted set per model: worker id -> its last heartbeat (unix time)
WORKER_INFO_PREFIX = "vela2:worker:"  # per live worker: its JSON description (`vela2 status`), TTL 3 beats
HEARTBEAT_S = 5.0  # a live worker beats this often; a reader counts one 3 beats old as gone
STARTING_PREFIX = "vela2:starting:"  # a sorted set per model: starting worker -> its last "starting" beat
CANCEL_PREFIX = "vela2:cancel:"  # a marker per cancelled request id (Client.cancel); the worker checks it at intake
JOB_PREFIX = "vela2:job:"  # a hash per bulk job (vela2.wire.jobs), and its id list `<key>:ids`
JOBS_PREFIX = "vela2:jobs:"  # a sorted set per model: job id -> its creation time (`vela2 jobs list`, metrics)
WAIT_PROBE_PREFIX = "vela2:wait-probe:"  # a worker writes it before a WAIT, so the WAIT covers every earlier write
JOB_HEADER = "vela2_job"  # the message header naming the job a message's requests belong to
TENANT_HEADER = "vela2_tenant"  # the message header naming the tenant its requests are scoped to (fair share)

# kombu's Redis transport: delivered, not yet acknowledged messages live in these (its defaults),
# and priority messages in sub-lists named <queue><sep><priority>.
UNACKED_KEY = "unacked"
UNACKED_INDEX_KEY = "unacked_index"
KOMBU_PRIORITY_SEP = "\x06\x16"
KOMBU_PRIORITY_STEPS = (3, 6, 9)


TENANT_SEP = "/"  # a tenant's request ids travel as "<tenant>/<id>": tenant names never hold it
TENANT_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")


def tenant_problem(tenant: object) -> str | None:
    """Why `tenant` cannot name a tenant, or None: 1-64 of A-Z a-z 0-9 _ . -, starting alphanumeric."""
    if not isinstance(tenant, str) or not TENANT_RE.fullmatch(tenant):
        return (f"a tenant name is 1-64 characters of A-Z a-z 0-9 _ . - starting with a letter or digit; "
                f"got {str(tenant)[:80]!r}")
    return None


def scoped_id(tenant: str | None, rid: str) -> str:
    """The id a tenant's request travels and is stored under (no tenant: the id itself). Two tenants'
    equal ids never meet: results, markers, attempts and the duplicate check all key on this."""
    return rid if tenant is None else f"{tenant}{TENANT_SEP}{rid}"


def unscoped_id(tenant: str | None, wire_id: str) -> str:
    """The caller's id of a scoped one (the inverse of scoped_id)."""
    prefix = "" if tenant is None else f"{tenant}{TENANT_SEP}"
    return wire_id[len(prefix):] if prefix and wire_id.startswith(prefix) else wire_id


def id_problem(rid: object) -> str | None:
    """Why `rid` cannot name a request, or None when it can: ids become Redis keys, so they are
    non-empty strings of at most LIMITS.max_id_chars characters that UTF-8 can encode."""
    if not isinstance(rid, str):
        return f"must be a string; got {type(rid).__name__} {str(rid)[:40]!r}"
    if not rid:
        return "is empty"
    if len(rid) > LIMITS.max_id_chars:
        return f"has {len(rid):,} characters; limit {LIMITS.max_id_chars:,}"
    try:
        rid.encode("utf-8")
    except UnicodeEncodeError as e:
        return f"is not valid Unicode ({e.reason} at index {e.start})"
    return None


def result_key(request_id: str) -> str:
    """The key (and pub/sub channel) of one request's result: `celery-task-meta-<id>`."""
    return RESULT_PREFIX + request_id


def submitted_key(request_id: str) -> str:
    """The marker key of a submitted request (`vela2:submitted:<id>`), so a reader can tell
    "submitted, not answered yet" from "never seen"."""
    return SUBMITTED_PREFIX + request_id


def attempts_key(request_id: str) -> str:
    """The counter of deliveries in which a request started running (`vela2:attempts:<id>`)."""
    return ATTEMPTS_PREFIX + request_id


def cancel_key(request_id: str) -> str:
    """The marker of a cancelled request (`vela2:cancel:<id>`): a worker that has not started it
    answers it `cancelled` instead of scoring it."""
    return CANCEL_PREFIX + request_id


def wait_probe_key(owner: str) -> str:
    """The key a worker writes just before `WAIT` (WAIT waits for its connection's last write)."""
    return WAIT_PROBE_PREFIX + owner


def job_key(job_id: str) -> str:
    """The hash of one bulk job (`vela2:job:<id>`, the id scoped to its tenant): fields and counters."""
    return JOB_PREFIX + job_id


def job_ids_key(job_id: str) -> str:
    """The list of a job's input lines in order (`vela2:job:<id>:ids`; vela2.wire.jobs says what an entry holds)."""
    return f"{JOB_PREFIX}{job_id}:ids"


def jobs_key(model_name: str) -> str:
    """The index of a model's jobs: a sorted set, job id -> creation time (unix seconds)."""
    return f"{JOBS_PREFIX}{model_name}"


def workers_key(model_name: str) -> str:
    """The heartbeats of a model's live workers (worker.runtime.leases writes, `vela2 http /readyz` reads)."""
    return f"{WORKERS_PREFIX}{model_name}"


def starting_key(model_name: str) -> str:
    """The beats of a model's workers still starting (loading the model; worker.runtime.announce writes,
    the clients' NoWorker check and `vela2 status` read), every HEARTBEAT_S until the engine serves."""
    return f"{STARTING_PREFIX}{model_name}"


def worker_info_key(model_name: str, worker_id: str) -> str:
    """A live worker's description (JSON: device, precision, checkpoint digest, batches, held
    messages, failures by reason), rewritten with every heartbeat and gone 3 beats after the last."""
    return f"{WORKER_INFO_PREFIX}{model_name}:{worker_id}"


# RabbitMQ (amqp://) declares a queue once and refuses a redeclaration with other arguments, so the
# workers that consume and the producers that declare before publishing use these, from here only:
# a durable quorum queue (every message replicated over the cluster's nodes, Raft majority).
# No x-delivery-limit: on RabbitMQ 3.x a message returned to the queue (a warm shutdown's returns)
# counts as a delivery too, so it could dead-letter a request that never ran; crashes are counted by
# the attempt counters in the result store instead (worker.engine.attempts).
AMQP_QUEUE_ARGUMENTS: dict[str, str] = {"x-queue-type": "quorum"}
AMQP_SCHEMES = ("amqp", "amqps", "pyamqp")


def is_amqp_url(url: str) -> bool:
    """Whether a broker URL names RabbitMQ (AMQP 0-9-1) rather than Redis."""
    return url.split("://", 1)[0].lower() in AMQP_SCHEMES


def online_queue(model_name: str) -> str:
    """The queue of interactive requests for a model, drained before its backfill queue."""
    return f"{QUEUE_PREFIX}{model_name}"


def backfill_queue(model_name: str) -> str:
    """The lower-priority queue of bulk requests for a model."""
    return f"{QUEUE_PREFIX}{model_name}{BACKFILL_SUFFIX}"


def queue_name(model_name: str, *, backfill: bool = False) -> str:
    """The queue of `model_name`: online, or backfill (lower priority)."""
    return backfill_queue(model_name) if backfill else online_queue(model_name)


def queues(model_name: str) -> list[str]:
    """The queues a worker of `model_name` consumes, highest priority first."""
    return [online_queue(model_name), backfill_queue(model_name)]


def is_backfill_queue(queue: str) -> bool:
    """True for a backfill queue's name (its batches yield to online ones)."""
    return queue.endswith(BACKFILL_SUFFIX)


def dead_letter(model_name: str) -> str:
    """The dead-letter list of a model: a JSON entry per poison request (one that was running each
    time a worker died, max_attempts times), newest first. Not a queue any worker consumes."""
    return f"{QUEUE_PREFIX}{model_name}{DEAD_SUFFIX}"


def priority_lists(queue: str) -> list[str]:
    """The Redis lists kombu keeps for `queue`: the queue itself and its priority sub-lists."""
    return [queue, *(f"{queue}{KOMBU_PRIORITY_SEP}{p}" for p in KOMBU_PRIORITY_STEPS)]


# Fair share (vela2.wire.taking): a tenant's messages wait on a list of their own beside the queue's,
# named with kombu's priority separator so that a taken item's list still names its queue; the
# tenants with messages waiting are the members of the queue's ring, scored by the service they had.
STORED_PREFIX = "vela2:stored:"  # a hash per tenant: the bytes of its stored results by expiry (vela2.wire.usage)
TENANT_SHARES_KEY = "vela2:tenant-shares"  # hash tenant -> its weight in the fair share (default 1)
TENANT_LIST_MARK, RING_MARK, CLOCK_MARK = "t", "ring", "clock"  # after the separator (taking's scripts too)


TOKENS_PREFIX = "vela2:tokens:"  # per tenant and unix second: the tokens the workers served it (vela2.wire.usage)


def tokens_key(tenant: str | None, second: int) -> str:
    """The counter of the tokens `tenant`'s requests were served in the unix second `second`."""
    return f"{TOKENS_PREFIX}{tenant or ''}:{second}"


def stored_key(tenant: str | None) -> str:
    """The hash counting what `tenant`'s stored results hold (keyless producers: tenant "")."""
    return f"{STORED_PREFIX}{tenant or ''}"


def tenant_list(queue: str, tenant: str | None) -> str:
    """The list `tenant`'s messages for `queue` wait on (no tenant: the queue's own list)."""
    return queue if not tenant else f"{queue}{KOMBU_PRIORITY_SEP}{TENANT_LIST_MARK}{tenant}"


def fair_ring(queue: str) -> str:
    """The sorted set of the tenants with messages waiting on `queue`: tenant -> its virtual time."""
    return f"{queue}{KOMBU_PRIORITY_SEP}{RING_MARK}"


def fair_clock(queue: str) -> str:
    """The virtual time of `queue`'s fair share: the last served tenant's."""
    return f"{queue}{KOMBU_PRIORITY_SEP}{CLOCK_MARK}"


def bell_key(queue: str) -> str:
    """The doorbell of a model's queues (online and backfill share one): a producer's push leaves a
    token on it, a take clears it, and an idle worker blocks on it."""
    base = queue[: -len(BACKFILL_SUFFIX)] if is_backfill_queue(queue) else queue
    return f"{base}{KOMBU_PRIORITY_SEP}bell"


def chunk_id(uuid_hex: str) -> str:
    """The message id of a bulk chunk."""
    return CHUNK_PREFIX + uuid_hex


def is_chunk_id(message_id: str) -> bool:
    """True for the id of a bulk chunk message."""
    return message_id.startswith(CHUNK_PREFIX)
