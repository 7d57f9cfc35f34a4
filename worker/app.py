"""Celery wiring only: the app, its settings, the task whose messages go to the engine, the bootstep.

    celery -A worker.app worker                 # settings from VELA2_* environment variables
    vela2 worker --checkpoint DIR ...           # the CLI builds WorkerSettings and calls run_worker()

The broker (`broker_url`, default the result store's `redis_url`) carries the messages; the result
backend (`redis_url`) holds the results. JSON only. One queue per model (`vela2.<model>`) drained
before its backfill queue (`vela2.<model>.backfill`): on Redis kombu's `queue_order_strategy=priority`
BRPOPs the queues in the listed order; on RabbitMQ (quorum queues) each queue has its own consumer
and prefetch credit, and the engine runs held online requests first. Pool solo, one process per
device: the `vela2.score` task's Strategy hands every message to the engine (worker.engine) instead
of the pool, and the engine acks a message only after all its results are stored; what is no
message of ours is wrapped before it gets there (the Redis channel, worker.transport.redis; on
RabbitMQ the consumer, worker.transport.amqp) and
answered or dead-lettered by the engine. The prefetch count (max_buffered)
bounds what the engine holds; at start the worker measures its worst batch and refuses to run
when the visibility timeout could expire on a message it still holds.
"""

from __future__ import annotations

import logging
import os
import re
import sys
from dataclasses import replace
from functools import partial
from typing import Any

from celery import Celery, Task, bootsteps, signals
from celery.utils.nodenames import default_nodename, host_format
from kombu import Queue

from vela2.errors import ConfigError, Vela2Error
from vela2.wire import keys
from vela2.wire.results import meta_row
from vela2.wire.urls import SentinelUrl, is_sentinel_url, parse_sentinel_url
from worker.engine.work import Delivery
from worker.obs import logs
from worker.runtime.checks import preflight
from worker.runtime.early import Early, serve_early
from worker.settings import WorkerSettings
from worker.transport.redis import ssl_options

log = logging.getLogger(__name__)

def _score(self: Task, *args: Any, **kwargs: Any) -> None:
    raise NotImplementedError(f"{keys.TASK_NAME} runs inside the vela2 worker engine only (celery -A worker.app)")


class ScoreTask(Task):
    """`vela2.score`: its Strategy hands each message to the engine instead of the pool."""

    typing = False
    acks_late = True  # the engine acks, and only after the message's results are stored

    def Strategy(self, task: Task, app: Celery, consumer: Any) -> Any:  # noqa: N802 (Celery's name)
        errors = consumer.connection_errors

        def on_message(message: Any, body: Any, ack: Any, reject: Any, callbacks: Any, **kwargs: Any) -> None:
            # `ack` / `reject` schedule message.ack / reject on the consumer's event loop (thread-safe),
            # so the engine thread may call them.
            delivery = Delivery(
                headers=dict(message.headers or {}),
                body=message.body if isinstance(message.body, bytes) else str(message.body).encode(),
                content_type=message.content_type,
                ack=partial(ack, log, errors),
                reject=lambda requeue: reject(log, errors, requeue=requeue),
                backfill=keys.is_backfill_queue(str((message.delivery_info or {}).get("routing_key", ""))),
                tag=message.delivery_tag,
            )
            engine = getattr(app, "vela2_engine", None)
            if engine is None:
                delivery.reject(True)
                return
            engine.submit(delivery)

        return on_message


class TaskEvents:
    """Celery task events (task-received / task-started / task-succeeded / task-failed) for every
    stored result, so Flower and `celery events` see the requests the engine answers (our Strategy
    bypasses Celery's own request objects, which would send them). Sent from the engine thread on a
    dispatcher that thread owns."""

    def __init__(self, app: Celery, hostname: str):
        self.app = app
        self.hostname = hostname
        self._dispatcher: Any = None

    def __call__(self, stored: list[tuple[str, str, dict[str, Any]]]) -> None:
        if self._dispatcher is None:
            self._dispatcher = self.app.events.Dispatcher(self.app.connection_for_write(), hostname=self.hostname,
                                                          enabled=True)
        send = self._dispatcher.send
        for rid, status, meta in stored:
            answer = meta_row(meta) or {}
            timings = answer.get("timings") or {}
            send("task-received", uuid=rid, name=keys.TASK_NAME, args="", kwargs="", retries=0, eta=None,
                 root_id=rid, parent_id=None)
            send("task-started", uuid=rid)
            if status == "error":
                err = answer.get("error") or {}
                send("task-failed", uuid=rid, exception=f"{err.get('type')}: {err.get('message')}", traceback="")
            else:
                send("task-succeeded", uuid=rid, result=status,
                     runtime=round(sum(v for k, v in timings.items() if k != "queue_ms") / 1e3, 6))


def _check_node_name(settings: WorkerSettings, node: str) -> None:
    """Warn when the hostname setting (VELA2_HOSTNAME) names another node than Celery's: `celery
    worker` takes its name from -n / --hostname only (`vela2 worker` passes the setting there)."""
    if not settings.hostname:
        return
    try:
        asked = node_name(settings)
    except ConfigError as e:
        asked = str(e)
    if asked != node:
        log.warning("hostname %s is not this worker's Celery node name %s: pass it to `celery worker` as -n",
                    asked, node)


def _shut_down_checkpoint_changed(app: Celery) -> None:
    """A warm shutdown, exit status CHECKPOINT_CHANGED_EXIT (run_worker returns it): the consumer's
    loop sees should_stop on its next turn (set from any thread, as Celery's signal handlers do)."""
    from celery.worker import state

    from worker.runtime.verify import CHECKPOINT_CHANGED_EXIT

    app.vela2_exit_code = CHECKPOINT_CHANGED_EXIT
    state.should_stop = CHECKPOINT_CHANGED_EXIT


class EngineStep(bootsteps.StartStopStep):
    """Worker bootstep: builds the engine before the consumer starts, drains it at warm shutdown
    (before the event loop's hub closes, so the acks it schedules still run)."""

    requires = ("celery.worker.components:Pool",)
    label = "vela2 engine"

    def __init__(self, w: Any, **kwargs: Any) -> None:
        super().__init__(w, **kwargs)
        self.engine: Any = None  # worker.engine.loop.Engine once started
        # health and metrics from now on, before the model stack loads (served already by `vela2 worker`)
        self.early: Early | None = getattr(w.app, "vela2_early", None) or serve_early(w.app.vela2_settings)

    def create(self, w: Any) -> None:
        return None

    def start(self, w: Any) -> None:
        _check_node_name(w.app.vela2_settings, w.hostname)
        # the node name as Celery expanded it names this worker everywhere: heartbeats, `vela2 status`
        settings: WorkerSettings = replace(w.app.vela2_settings, hostname=w.hostname)
        # w.task_events: `celery worker -E` or worker_send_task_events (VELA2_TASK_EVENTS=1)
        events = TaskEvents(w.app, w.hostname) if getattr(w, "task_events", False) else None
        from worker.runtime.announce import announce_start
        from worker.runtime.startup import build_engine, exit_on_start_failure  # the model stack: torch

        starting = announce_start(settings)  # producers wait for a starting worker, not NoWorker
        try:
            self.engine = build_engine(settings, events, w.app.vela2_pipeline_wrapper, self.early,
                                       on_checkpoint_changed=partial(_shut_down_checkpoint_changed, w.app))
        except Exception as e:  # Celery would log it and exit 0: a supervisor must see the failure
            if starting is not None:
                starting.stop()
            exit_on_start_failure(e)
        if starting is not None:
            starting.stop()  # the engine's heartbeats go on from here
        w.app.vela2_engine = self.engine

    def stop(self, w: Any) -> None:
        if self.engine is not None:
            self.engine.stop(w.app.vela2_settings.shutdown_timeout_s)
            self.engine = None

    def terminate(self, w: Any) -> None:
        if self.engine is not None:
            self.engine.stop(0.0)
            self.engine = None


def create_app(settings: WorkerSettings | None = None, *, pipeline_wrapper: Any = None) -> Celery:
    """The Celery app of a worker with these settings (from the environment when None).
    `pipeline_wrapper` wraps the scoring pipeline: a test seam (stack.faults), None in production."""
    settings = settings or WorkerSettings.from_env()
    broker_url = settings.resolved_broker_url
    broker_sentinel, store_sentinel = _sentinel(broker_url, "broker"), _sentinel(settings.redis_url, "result store")
    app = Celery("vela2", broker=broker_sentinel.kombu_url() if broker_sentinel else broker_url,
                 backend=store_sentinel.kombu_url() if store_sentinel else settings.redis_url, set_as_current=False)
    try:
        model_name: str | None = settings.resolved_model_name()
    except Vela2Error as e:  # no checkpoint yet: fine for inspecting; the worker refuses to start
        log.debug("no model name yet: %s", e)
        model_name = None
    queues = keys.queues(model_name) if model_name else []
    amqp = keys.is_amqp_url(broker_url)
    _use_our_transport(app, broker_url, broker_sentinel, store_sentinel)
    # RabbitMQ: durable quorum queues (Celery then sets a per-consumer prefetch, the only kind quorum
    # queues have); the online and the backfill queue are two consumers with a credit each, so each
    # gets half of max_buffered: what the engine holds stays within it, and a backfill backlog never
    # takes the credit online messages need (the engine runs online batches first among those held)
    queue_args = {"durable": True, "queue_arguments": keys.AMQP_QUEUE_ARGUMENTS} if amqp else {}
    prefetch = max(1, settings.max_buffered // len(queues)) if amqp and queues else settings.max_buffered
    app.conf.update(
        task_serializer="json",
        result_serializer="json",
        accept_content=["json"],
        result_accept_content=["json"],
        task_acks_late=True,
        task_reject_on_worker_lost=True,
        worker_pool="solo",
        worker_concurrency=1,
        worker_prefetch_multiplier=prefetch,
        broker_transport_options={} if amqp else {
            **settings.transport_options(),
            **({"master_name": broker_sentinel.master_name, "sentinel_kwargs": broker_sentinel.sentinel_kwargs()}
               if broker_sentinel else {})},
        broker_connection_retry_on_startup=True,
        result_expires=settings.result_expires_s,
        worker_send_task_events=bool(settings.task_events),
        task_queues=[Queue(q, routing_key=q, **queue_args) for q in queues] or None,
        task_default_queue=queues[0] if queues else "celery",
        task_create_missing_queues=True,
    )
    if settings.log_format == "json":
        signals.after_setup_logger.connect(logs.use_json, weak=False)
        signals.after_setup_task_logger.connect(logs.use_json, weak=False)
    app.vela2_settings = settings
    app.vela2_pipeline_wrapper = pipeline_wrapper
    app.vela2_early = None  # run_worker: the endpoints its caller serves already (worker.runtime.early)
    app.vela2_engine = None
    app.vela2_exit_code = 0  # set when the worker stops for a reason of its own (a changed checkpoint)
    app.task(name=keys.TASK_NAME, base=ScoreTask, bind=True)(_score)
    app.steps["worker"].add(EngineStep)
    return app


def _use_our_transport(app: Celery, broker_url: str, broker_sentinel: SentinelUrl | None,
                       store_sentinel: SentinelUrl | None) -> None:
    """Celery's transport and consumer replaced by ours (worker.transport): queue items triaged,
    writes retried; Sentinel masters where the URLs name sentinels."""
    if broker_url.startswith(("redis://", "rediss://")):
        app.conf.broker_transport = "worker.transport.redis:RedisTransport"  # triaged items, writes retried
        app.conf.broker_use_ssl = ssl_options(broker_url)
    elif broker_sentinel:
        app.conf.broker_transport = "worker.transport.redis:SentinelTransport"
    if store_sentinel:
        app.conf.result_backend_transport_options = {"master_name": store_sentinel.master_name,
                                                      "sentinel_kwargs": store_sentinel.sentinel_kwargs()}
    if keys.is_amqp_url(broker_url):  # every delivery triaged before Celery dispatches it, as the Redis channel does
        app.conf.worker_consumer = "worker.transport.amqp:TriagingConsumer"


def _sentinel(url: str, what: str) -> SentinelUrl | None:
    """`url` read as a sentinel:// URL, or None (another scheme, or a bad sentinel URL: the worker's
    preflight ends it with one line naming the URL before Celery connects)."""
    if not is_sentinel_url(url):
        return None
    try:
        return parse_sentinel_url(url, what)
    except ConfigError as e:
        log.debug("%s", e)
        return None


def node_name(settings: WorkerSettings, pid: int | None = None) -> str:
    """The worker's Celery node name, expanded as `celery worker --hostname` expands it
    (celery.utils.nodenames: %h, %n, %d; a name without @ is a host): `settings.hostname`, else
    vela2-<model>-<device>-<pid>@%h, so that two workers on one host never share a name (Flower shows
    one of two that do, `celery inspect` warns DuplicateNodename). ConfigError naming the value for
    an abbreviation Celery does not know."""
    template = settings.hostname
    if not template:
        try:
            model: str | None = settings.resolved_model_name()
        except (Vela2Error, OSError, ValueError):  # no (readable) checkpoint: start-up says so, later
            model = None
        parts = ["vela2", model, settings.device, str(os.getpid() if pid is None else pid)]
        # what Celery would read in a name: "@" splits it, "%" expands
        template = "-".join(re.sub(r"[^A-Za-z0-9_.-]+", "", p) for p in parts if p) + "@%h"
    try:
        return host_format(default_nodename(template))
    except ValueError as e:  # celery.utils.text.simple_format: an unknown %-abbreviation
        raise ConfigError(f"hostname {template!r}: {str(e).splitlines()[0]} (Celery expands %h, %n, %d, %i and "
                          "%I; %% is a %)") from None


def run_worker(settings: WorkerSettings, *, loglevel: str = "INFO", hostname: str | None = None,
               early: Early | None = None) -> int:
    """Run a worker in this process until it is shut down (SIGTERM: warm); returns the exit code.
    `early`: the endpoints the caller already serves (worker.runtime.early), taken over at start.
    `hostname`: the Celery node name (default `node_name(settings)`).

    What `vela2 worker` calls: `run_worker(WorkerSettings.from_env(checkpoint=..., device=..., ...))`.
    """
    preflight(settings)
    app = create_app(settings)
    app.vela2_early = early
    node = hostname or node_name(settings)
    argv = [
        "worker",
        "--pool",
        "solo",
        "--concurrency",
        "1",
        "--loglevel",
        loglevel,
        "--without-mingle",
        "--without-gossip",
        "--hostname",
        node,
    ]
    try:
        code = app.start(argv)  # (app.worker_main drops the worker's exit code)
    except SystemExit as e:
        code = int(e.code or 0) if not isinstance(e.code, str) else 1
    return int(app.vela2_exit_code or code or 0)


app = create_app()

if __name__ == "__main__":
    sys.exit(run_worker(WorkerSettings.from_env()))
