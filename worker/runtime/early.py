"""The worker's metrics and health endpoints from the first second of its life.

Loading a 9B checkpoint takes a minute and more; a worker whose /livez refused connections until then
was restarted in a loop by any liveness probe with a shorter initial delay. So the endpoints start
before the model stack is imported (no torch here: `vela2 worker` and the Celery bootstep call this
first), /livez answers 200 at once, and /readyz 503 naming the stage start-up is in (Health.begin)
until the engine serves; start-up (worker.runtime.startup) then takes this Metrics and Health over.
"""

from __future__ import annotations

from dataclasses import dataclass

from worker.obs.health import Health
from worker.obs.metrics import Metrics
from worker.settings import WorkerSettings


@dataclass
class Early:
    """The served Metrics and Health of a worker still starting."""

    metrics: Metrics
    health: Health


def serve_early(settings: WorkerSettings) -> Early | None:
    """Serve /metrics, /livez and /readyz on the settings' metrics port now (None: no port set)."""
    if not settings.metrics_port:
        return None
    metrics = Metrics(row_tokens=settings.engine.row_tokens)
    health = Health(settings.model_name or "")
    metrics.serve(settings.metrics_port, settings.metrics_host, health)
    health.begin("importing the model stack")
    return Early(metrics, health)
