"""The fault suite: real redis-server, real `celery -A worker.app worker` processes on the demo
checkpoint, real producers; each scenario injects one kind of fault and counts what became of every
request it sent.

    .venv/bin/python -m bench.faults [--out bench/results/reliability.json] [--only NAME,...]
        [--scale 1.0] [--soak-minutes N] [--checkpoint DIR] [--device cpu] [--fuzz-examples 500]
        [--repeat N] [--cpu-hog K] [--cpu-processes N] [--device-process 0|1] [--keep]
        [--broker amqp://USER:PW@HOST:PORT]

(`make reliability`, `make soak MINUTES=N`.) Every scenario is self-contained: its own redis-server
on a free loopback port in a temporary directory (AOF on where a restart must keep the queue), its
own workers configured through VELA2_* variables (faults injected with stack.faults.Faults), its
own requests; both come from the process harness (stack.harness), and the workers' counts from the
engine's JSON stats line at shutdown. After the scenario settles, every request id is read back:

- `answered_ok` / `answered_error` / `expired`: the stored answer's status;
- `lost`: no stored answer at all (the suite exits non-zero when any scenario loses one);
- `duplicate_answers_changed`: answers that differ from the first value the suite saw for that id
  (results are write-once: this must stay 0 however often a message is delivered).

Scenarios (registry.SCENARIOS, in this order; see each function's docstring): sigkill, sigterm,
redis_restart, malformed, oversized, oom, duplicate, visibility, poison, redis_down, redis_full,
bad_id, queue_items (also over rediss:// when redis-server has TLS), deep_body, start_failures;
then the hypothesis fuzz of the request schemas and the renderer and, with --soak-minutes, a soak
run sampling worker RSS and GPU memory. With `--broker amqp://...` (this host's RabbitMQ;
`rabbitmqctl` makes a vhost per scenario) the RabbitMQ scenarios run instead
(registry.AMQP_SCENARIOS: sigkill, sigterm, broker_drop, broker_restart, duplicate, poison,
malformed), results in a fresh redis-server each. `--scale` multiplies request counts (and the
redis_down outage); the tests run a few scenarios at a tiny scale. `--repeat N` runs the selected
scenarios N times and `--cpu-hog K` runs K busy-loop processes beside them (a loaded machine); the
report lists every run's outcome (`scenarios`, each with its `run`; `runs` per scenario), never
only the best. Exit status: 0 when nothing was lost, no answer changed and every check of every run
held; 1 otherwise.

The package:

- framework: `context` (Suite, the run context: checkpoint, scale, worker settings, the processes a
  scenario starts; worker helpers), `accounting` (Tracker: every id read back, lost and changed
  answers, lost forensics), `report` (Outcome per scenario run, the summary figures, the JSON and
  the table), `traffic` (rows, tampered messages, a producer retrying through outages),
  `registry` (scenario name -> function), `runner` (a scenario in its own processes, repeats, CPU
  hogs, fuzz and soak), `cli` (`python -m bench.faults`);
- scenarios, by what they attack: `crashes` (sigkill, sigterm, oom, poison), `delivery`
  (duplicate, visibility), `redis` (redis_restart, redis_down, redis_full), `malformed`
  (malformed, oversized, deep_body), `queue_items` (queue_items, bad_id), `startup`
  (start_failures), `amqp` (the RabbitMQ scenarios);
- `soak`, `fuzz` (also `python -m bench.faults.fuzz`).
"""
