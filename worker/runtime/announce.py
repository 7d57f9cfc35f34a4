"""A worker says it is starting: from the Celery worker's boot until its engine serves (loading a 9B
checkpoint takes a minute and more), a thread beats every keys.HEARTBEAT_S into
`keys.starting_key(model)` (a sorted set: node name -> unix time), so that a producer's wait for an
answer waits for this worker instead of ending with NoWorker (producer.liveness), and `vela2 status`
lists it as starting. Once the engine serves, its heartbeats (worker.runtime.leases) take over and
the entry is taken away; a worker that dies while it starts stops beating, and its entry ages out as
a heartbeat does. /readyz counts no starting worker: it is not ready."""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

from vela2.errors import Vela2Error
from vela2.wire import keys
from vela2.wire.connections import redis_client
from worker.settings import WorkerSettings

log = logging.getLogger(__name__)

FORGET_AFTER_S = 60 * keys.HEARTBEAT_S  # entries this old are dropped with each beat (as the heartbeats')


class Announcer:
    """Beats `worker_id` into the starting set of `model` in `redis` from a thread of its own until
    `stop()`."""

    def __init__(self, redis: Any, model: str, worker_id: str, interval_s: float = keys.HEARTBEAT_S):
        self.redis, self.model, self.worker_id, self.interval_s = redis, model, worker_id, interval_s
        self.beats = 0  # beats that went through (tests read it)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> Announcer:
        self._thread = threading.Thread(target=self._run, name="vela2-starting", daemon=True)
        self._thread.start()
        return self

    def beat(self) -> None:
        """Say "starting" now (and drop the entries of workers long gone)."""
        now = time.time()
        pipe = self.redis.pipeline(transaction=False)
        pipe.zadd(keys.starting_key(self.model), {self.worker_id: now})
        pipe.zremrangebyscore(keys.starting_key(self.model), "-inf", now - FORGET_AFTER_S)
        pipe.execute()
        self.beats += 1

    def stop(self) -> None:
        """Stop beating and take the entry away (the engine's heartbeats say more from now on)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(5)
        try:
            self.redis.zrem(keys.starting_key(self.model), self.worker_id)
        except Exception as e:  # Redis away: the entry goes stale on its own
            log.warning("taking the starting beat away failed: %s", e)
        self.redis.close()

    def _run(self) -> None:
        while True:
            try:
                self.beat()
            except Exception as e:  # Redis away: the next beat tries again
                log.warning("the starting beat failed: %s", e)
            if self._stop.wait(self.interval_s):
                return


def announce_start(settings: WorkerSettings) -> Announcer | None:
    """An Announcer, started, for the worker of `settings` (named `settings.hostname`, the Celery
    node name) in its result store; None when its model name cannot be read (no checkpoint, or a bad
    one: start-up says why and the worker exits)."""
    try:
        model = settings.resolved_model_name()
    except (Vela2Error, OSError, ValueError) as e:
        log.debug("not announcing a start: %s", e)
        return None
    return Announcer(redis_client(settings.redis_url), model, settings.hostname or model).start()
