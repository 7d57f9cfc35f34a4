"""The scenario registry: name -> function(Suite, Outcome), in the order the suite runs them. Each
function runs one scenario in processes of its own (through the Suite) and records its counts,
notes and checks on the Outcome; run_scenario (bench.faults.runner) turns an exception into a
failed check. A new scenario is a function in the module of what it attacks, listed here."""

from __future__ import annotations

from collections.abc import Callable

from bench.faults import amqp, cells, crashes, delivery, malformed, queue_items, redis, startup, tenants
from bench.faults.context import Suite
from bench.faults.report import Outcome

Scenario = Callable[[Suite, Outcome], None]

# With Redis as broker (the default).
SCENARIOS: dict[str, Scenario] = {
    "sigkill": crashes.scenario_sigkill,
    "sigterm": crashes.scenario_sigterm,
    "redis_restart": redis.scenario_redis_restart,
    "malformed": malformed.scenario_malformed,
    "oversized": malformed.scenario_oversized,
    "oom": crashes.scenario_oom,
    "duplicate": delivery.scenario_duplicate,
    "visibility": delivery.scenario_visibility,
    "poison": crashes.scenario_poison,
    "redis_down": redis.scenario_redis_down,
    "redis_full": redis.scenario_redis_full,
    "bad_id": queue_items.scenario_bad_id,
    "queue_items": queue_items.scenario_queue_items,
    "deep_body": malformed.scenario_deep_body,
    "start_failures": startup.scenario_start_failures,
    "tenant_quota": tenants.scenario_tenant_quota,
    "cell_down": cells.scenario_cell_down,
}

# Run instead of SCENARIOS with --broker amqp://... `malformed` publishes its bad deliveries raw to
# the quorum queue (the worker's consumer triages them, worker.transport.amqp); `broker_restart`
# stops and starts the RabbitMQ application of this host's node (left running whatever happens; not
# while other vhosts have clients). What is not here, and why: bench.faults.amqp.
AMQP_SCENARIOS: dict[str, Scenario] = {
    "sigkill": amqp.amqp_sigkill,
    "sigterm": amqp.amqp_sigterm,
    "broker_drop": amqp.amqp_broker_drop,
    "broker_restart": amqp.amqp_broker_restart,
    "duplicate": amqp.amqp_duplicate,
    "poison": amqp.amqp_poison,
    "malformed": amqp.amqp_malformed,
}


def table(amqp_broker: bool) -> dict[str, Scenario]:
    """The scenarios of this broker: AMQP_SCENARIOS on RabbitMQ, SCENARIOS on Redis."""
    return AMQP_SCENARIOS if amqp_broker else SCENARIOS
