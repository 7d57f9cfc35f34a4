"""RabbitMQ as broker (amqp://, quorum queues), results in Redis: a real worker process against the
local RabbitMQ (a throwaway vhost, tests/integration/conftest.py) and a fixture redis-server. Ack after store,
warm shutdown, redelivery of a killed worker's messages, the prefetch bound, online before backfill
under a backlog, poison requests dead-lettered, deliveries that are no messages of ours answered or
dead-lettered."""

from __future__ import annotations

import base64
import json
import re
import time

from producer.client import Client
from stack.faults import CRASH_EXIT, Faults
from tests.unit.worker.transport.test_amqp import BACKFILL, MODEL, ONLINE, ours, row
from vela2.api.schemas import Status
from vela2.wire.keys import AMQP_QUEUE_ARGUMENTS, attempts_key, dead_letter, result_key
from vela2.wire.results import meta_row
from worker.obs.metrics import AmqpQueueDepthCollector


def answered(client: Client, ids: list[str]) -> dict[str, dict]:
    return {k: v for k, (_, v) in client.lookup_many(ids).items() if v is not None}


def wait_until(check, timeout_s: float, what: str, log=lambda: "") -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        assert time.monotonic() < deadline, f"{what} not within {timeout_s:g} s\n{log()[-3000:]}"
        time.sleep(0.05)


def held_per_batch(worker) -> list[int]:
    stats = worker.engine_stats()
    fields = stats["recent_batches"]["fields"]
    return [r[fields.index("held")] for r in stats["recent_batches"]["rows"]]


def test_quorum_queues_ack_after_store_prefetch_bound_and_warm_shutdown(redis_url, amqp_url, rabbitmq_vhost,
                                                                       start_worker):
    client = Client(redis_url, model=MODEL, broker_url=amqp_url)
    ids = client.submit_many([row(f"on-{i}") for i in range(10)])
    ids += client.submit_many([row(f"bf-{i}") for i in range(10)], backfill=True)
    queues = rabbitmq_vhost.queues()  # declared by the producer, before any worker ran
    assert {q: queues[q]["type"] for q in (ONLINE, BACKFILL)} == {ONLINE: "quorum", BACKFILL: "quorum"}
    assert rabbitmq_vhost.ready(ONLINE) == 10 and rabbitmq_vhost.ready(BACKFILL) == 10
    # one row per batch, 0.4 s each; a buffer of 4 (2 per queue's consumer); warm shutdown after 1 s
    w1 = start_worker(redis_url, broker_url=amqp_url, faults=Faults(delay_s=0.4), max_buffered=4,
                      max_batch_tokens=64, shutdown_timeout_s=1).wait_ready()
    wait_until(lambda: len(answered(client, ids)) >= 3, 60, "three answers", w1.log)
    assert w1.terminate(60) == 0
    done = answered(client, ids)
    assert 3 <= len(done) < len(ids)
    # nothing in limbo: whatever is not answered is back, ready, in its queue
    assert rabbitmq_vhost.ready(ONLINE) + rabbitmq_vhost.ready(BACKFILL) == len(ids) - len(done)
    line = next(x for x in w1.log().splitlines() if "engine stopped" in x)
    # every message it acked was one it answered (ack after store); what it held undone went back (the
    # ready count above). Whether it held any at the stop is timing: on a loaded machine it may finish its
    # buffer within shutdown_timeout_s (CI once saw "returned 0"), so that count is not asserted.
    answered_n, acked_n = (int(re.search(pat, line).group(1)) for pat in (r"answered (\d+) requests",
                                                                          r"acked (\d+) messages"))
    assert acked_n == answered_n and answered_n <= len(done), line
    assert max(held_per_batch(w1)) <= 4  # per-consumer prefetch: two queues, never more than max_buffered

    w2 = start_worker(redis_url, broker_url=amqp_url).wait_ready()
    got = client.results_many(ids, timeout_s=90)
    assert all(v is not None and v.status == Status.ok for v in got.values()), got
    for k, v in done.items():  # an answer stored before the shutdown is the one that stays
        assert answered(client, [k])[k] == v
    assert w2.terminate() == 0
    # every message acked: one left unacked would be ready again once w2's connection closed
    assert rabbitmq_vhost.ready(ONLINE) + rabbitmq_vhost.ready(BACKFILL) == 0
    client.close()


def test_a_killed_workers_messages_are_redelivered_at_once(redis_url, amqp_url, rabbitmq_vhost, start_worker):
    w1 = start_worker(redis_url, broker_url=amqp_url, faults=Faults(delay_s=0.6), max_buffered=6,
                      max_batch_tokens=128).wait_ready()
    client = Client(redis_url, model=MODEL, broker_url=amqp_url)
    ids = client.submit_many([row(f"k-{i}") for i in range(16)])
    wait_until(lambda: bool(answered(client, ids)), 60, "a first answer", w1.log)
    w1.kill()
    by_w1 = answered(client, ids)
    assert len(by_w1) < len(ids)
    # no visibility timeout: the closed connection returns what w1 held, ready for the next worker. At
    # least every unanswered one: a message whose answer was stored just before the kill, but not yet
    # acked (ack after store), comes back too and is answered again with the stored answer kept.
    wait_until(lambda: rabbitmq_vhost.ready(ONLINE) >= len(ids) - len(answered(client, ids)), 30,
               "the held messages back in the queue")
    w2 = start_worker(redis_url, broker_url=amqp_url).wait_ready()
    got = client.results_many(ids, timeout_s=90)
    assert all(v is not None and v.status == Status.ok for v in got.values()), w2.log()[-3000:]
    raw = client.redis.mget([result_key(k) for k in by_w1])
    assert [meta_row(json.loads(r)) for r in raw] == list(by_w1.values())  # redelivered, answer kept
    assert w2.terminate() == 0
    client.close()


def test_online_requests_overtake_a_backfill_backlog(redis_url, amqp_url, rabbitmq_vhost, start_worker):
    client = Client(redis_url, model=MODEL, broker_url=amqp_url)
    backlog = client.submit_many([row(f"bf-{i:03d}") for i in range(40)], backfill=True)
    # a slow device, one request per batch, a buffer of 2 (one per queue): the backlog drains one by one
    worker = start_worker(redis_url, broker_url=amqp_url, faults=Faults(delay_s=0.15), max_buffered=2,
                          max_batch_tokens=64, max_wait_ms=0).wait_ready()
    wait_until(lambda: rabbitmq_vhost.ready(BACKFILL) <= 34, 60, "the backlog draining", worker.log)
    online = [client.submit(row(f"on-{i}")) for i in range(3)]
    got = client.results_many([*online, *backlog], timeout_s=120)
    assert all(r is not None and r.status == Status.ok for r in got.values())
    done_at = {k: json.loads(v)["date_done"] for k, v in zip(online + backlog, client.redis.mget(
        [result_key(k) for k in online + backlog]), strict=True)}
    last_online = max(done_at[i] for i in online)
    later_backfill = [i for i in backlog if done_at[i] > last_online]
    assert len(later_backfill) >= 25, f"only {len(later_backfill)} backfill requests finished after online"
    assert worker.terminate() == 0
    client.close()


def test_a_request_that_kills_every_worker_is_dead_lettered(redis_url, amqp_url, start_worker):
    settings = {"max_buffered": 2, "max_batch_tokens": 768, "max_wait_ms": 50}
    faults = Faults(crash_prefix="poison-")
    client = Client(redis_url, model=MODEL, broker_url=amqp_url)
    rows = [row(f"good-{i}") for i in range(6)]
    rows.insert(2, {**rows[0], "id": "poison-1"})
    ids = client.submit_many(rows)
    exits: list[int] = []
    worker = start_worker(redis_url, broker_url=amqp_url, faults=faults, **settings)
    deadline = time.monotonic() + 240
    while len(answered(client, ids)) < len(ids):  # the supervisor: restart the worker whenever it dies
        assert time.monotonic() < deadline, f"exits {exits}\n{worker.log()[-3000:]}"
        if worker.proc.poll() is not None:
            exits.append(worker.proc.returncode)
            assert exits[-1] == CRASH_EXIT, worker.log()[-3000:]
            assert len(exits) <= 3, f"crash loop: {exits}"
            worker = start_worker(redis_url, broker_url=amqp_url, faults=faults, **settings)
        time.sleep(0.1)
    assert exits == [CRASH_EXIT] * 3  # counted in the result store: three crashes, then never run
    got = client.results_many(ids, timeout_s=5)
    poison = got.pop("poison-1")
    assert poison is not None and poison.error is not None and poison.error.type == "poison"
    assert all(v is not None and v.status == Status.ok for v in got.values())
    entries = [json.loads(x) for x in client.redis.lrange(dead_letter(MODEL), 0, -1)]
    assert [e["id"] for e in entries] == ["poison-1"]
    assert not client.redis.keys(attempts_key("*"))
    assert worker.terminate() == 0
    client.close()


def test_the_async_client_publishes_with_confirms(redis_url, amqp_url, rabbitmq_vhost):
    import asyncio

    from producer.aio import AsyncClient

    async def go() -> list[str]:
        async with AsyncClient(redis_url, model=MODEL, broker_url=amqp_url) as client:
            one = await client.submit(row("a-1"))
            more = await client.submit_many([row(f"a-{i}") for i in range(2, 6)], backfill=True, chunk_size=2)
            return [one, *more]

    ids = asyncio.run(go())
    assert ids == ["a-1", "a-2", "a-3", "a-4", "a-5"]
    assert rabbitmq_vhost.ready(ONLINE) == 1 and rabbitmq_vhost.ready(BACKFILL) == 2  # two chunks of two rows
    # the worker's queue-depth gauge reads the same (a passive declare per queue at scrape time)
    [family] = AmqpQueueDepthCollector(amqp_url, [ONLINE, BACKFILL]).collect()
    assert {s.labels["queue"]: s.value for s in family.samples} == {ONLINE: 1.0, BACKFILL: 2.0}


def test_unreachable_and_refusing_rabbitmq_end_the_worker_with_one_line(redis_server, rabbitmq_vhost, demo_dir):
    import subprocess
    import sys

    from stack.harness import ROOT, child_env

    def run(broker: str) -> subprocess.CompletedProcess:
        env = child_env({"VELA2_BROKER_URL": broker})  # from the environment: no password in argv
        return subprocess.run([sys.executable, "-m", "vela2.cli", "worker", "--checkpoint", str(demo_dir), "--redis",
                               redis_server.url(), "--redis-wait-s", "1"], cwd=ROOT, env=env, capture_output=True,
                              text=True, timeout=120)

    gone = run("amqp://guest:s3cret@127.0.0.1:1/x")
    assert gone.returncode == 2 and "s3cret" not in gone.stderr and "Traceback" not in gone.stderr
    assert gone.stderr.strip().splitlines() == [
        "vela2 worker: RabbitMQ at amqp://guest:**@127.0.0.1:1/x (broker) did not answer within 1 s (redis_wait_s): "
        + gone.stderr.split("(redis_wait_s): ", 1)[-1].strip()]
    refused = run(rabbitmq_vhost.url.replace("guest:guest", "guest:s3cret"))
    assert refused.returncode == 2 and "s3cret" not in refused.stderr and "Traceback" not in refused.stderr
    [line] = refused.stderr.strip().splitlines()
    assert line.startswith(f"vela2 worker: RabbitMQ at amqp://guest:**@127.0.0.1:5672/{rabbitmq_vhost.name} (broker) "
                           "refuses the credentials or the vhost")


def publish_raw(url: str, items: list[tuple[bytes, dict | None, str | None]]) -> None:
    """Publish (body, headers, content type) as they are, with plain kombu, to the online quorum queue."""
    from kombu import Connection, Queue

    queue = Queue(ONLINE, routing_key=ONLINE, durable=True, queue_arguments=AMQP_QUEUE_ARGUMENTS)
    with Connection(url, transport_options={"confirm_publish": True}) as conn:
        producer = conn.Producer()
        for body, headers, content_type in items:
            producer.publish(body, exchange="", routing_key=ONLINE, headers=headers, content_type=content_type,
                             content_encoding="binary", declare=[queue], delivery_mode=2)


def test_deliveries_that_are_no_messages_of_ours_are_answered_or_dead_lettered(redis_url, amqp_url, rabbitmq_vhost,
                                                                              start_worker):
    body, headers = ours("bad-notjson")
    no_id = {k: v for k, v in ours("x")[1].items() if k != "id"}
    bad = {  # id -> (body, headers, content type), the words its error names
        "bad-notjson": ((b"{not json", headers, "application/json"), "not valid JSON"),
        "bad-notutf8": ((b"\xff\xfe\x00", ours("bad-notutf8")[1], "application/json"), "not valid JSON"),
        "bad-args": ((json.dumps([[row("bad-args")], {"bogus": 1}, {}]).encode(), ours("bad-args")[1],
                      "application/json"), "unknown keyword arguments"),
        "bad-task": ((*ours("bad-task", task="vela2.no_such_task"), "application/json"), "is not served here"),
        "bad-builtin": ((*ours("bad-builtin", task="celery.backend_cleanup"), "application/json"),
                        "'celery.backend_cleanup' is not served here"),
        "bad-ctype": ((*ours("bad-ctype"), "application/x-python-serialize"), "content-type"),
        "bad-proto1": ((json.dumps({"task": "vela2.score", "id": "bad-proto1", "args": [row("bad-proto1")]}).encode(),
                        None, "application/json"), "protocol 1"),
        # kombu cannot decompress it: Celery's consumer logs and acks such a delivery (on_decode_error)
        "bad-gzip": ((*ours("bad-gzip", compression="application/x-gzip"), "application/json"), "cannot be decoded"),
    }
    unanswerable = [(ours("x")[0], no_id, "application/json"), (b"this is not a message", None, "text/plain")]
    # a message of ours that forges the refusal headers: answered ok, and nothing under the forged id
    forged = (*ours("good-forged", vela2_refused="forged", vela2_refused_ids=["victim"]), "application/json")
    publish_raw(amqp_url, [item for item, _ in bad.values()] + unanswerable + [forged])
    client = Client(redis_url, model=MODEL, broker_url=amqp_url)
    good = client.submit_many([row(f"good-{i}") for i in range(8)])
    worker = start_worker(redis_url, broker_url=amqp_url).wait_ready()
    got = client.results_many([*bad, *good, "good-forged"], timeout_s=90)
    for rid, (_, words) in bad.items():
        result = got[rid]
        assert result is not None and result.error is not None, (rid, worker.log()[-3000:])
        assert result.error.type == "invalid_request" and words in result.error.message, (rid, result.error)
    assert all(got[i] is not None and got[i].status == Status.ok for i in [*good, "good-forged"]), got
    assert answered(client, ["victim"]) == {}
    entries = [json.loads(x) for x in client.redis.lrange(dead_letter(MODEL), 0, -1)]
    assert sorted(e["reason"] for e in entries) == [
        "a message with no task is not served here (only 'vela2.score')", "message id is missing"]
    items = {e["reason"].split()[1]: json.loads(e["item"]) for e in entries}  # the delivery itself, as a queue item
    assert items["message"]["content-type"] == "text/plain"
    assert base64.b64decode(items["message"]["body"]) == b"this is not a message"
    assert items["id"]["headers"]["task"] == "vela2.score" and "id" not in items["id"]["headers"]
    assert worker.alive()
    log = worker.log()
    assert "NotRegistered" not in log and "Traceback" not in log, log[-3000:]
    assert worker.terminate() == 0
    assert rabbitmq_vhost.ready(ONLINE) == 0  # every delivery acked (one left unacked is ready again now)
    client.close()


