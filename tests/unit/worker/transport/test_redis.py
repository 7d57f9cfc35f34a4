"""The worker's take and restore scripts on fakeredis, and how held records tell ours from kombu's."""

from __future__ import annotations

import json
import time

import redis as redis_lib

from vela2.wire import keys, taking

Q = keys.online_queue("m")


def _take(r: redis_lib.Redis, lists: list[str], most: int, prefix: str = "p") -> list[tuple[bytes, bytes, bytes]]:
    take_keys = taking.take_keys(lists, keys.bell_key(Q))
    reply = r.eval(taking.TAKE_SCRIPT, len(take_keys), *take_keys, repr(time.time()), most, prefix)
    return [tuple(reply[i:i + 3]) for i in range(0, len(reply), 3)]


def _push(r: redis_lib.Redis, tenant: str | None, items: list[str], queue: str = Q, limit: int = 0) -> int:
    return r.eval(taking.PUSH_SCRIPT, 3, *taking.push_keys(queue, tenant), tenant or "", limit, len(items), *items)


def _order(r: redis_lib.Redis, most: int, lists: list[str] | None = None) -> str:
    """The first letters of what one take returns."""
    return "".join(item.decode()[0] for _, _, item in _take(r, lists or keys.priority_lists(Q), most))


def test_a_take_shares_the_queue_fairly_across_tenants_by_weight():
    import fakeredis

    r = fakeredis.FakeRedis()
    _push(r, "A", [f"a{i}" for i in range(300)])
    _push(r, "B", [f"b{i}" for i in range(300)])
    assert _order(r, 8) == "abababab"  # equal shares: one message each in turn
    r.hset(keys.TENANT_SHARES_KEY, "A", 3)
    got = _order(r, 64) + _order(r, 64)
    assert abs(got.count("a") - 3 * got.count("b")) <= 4, got  # share 3: three of A's to one of B's
    _push(r, "C", ["c0"])  # a tenant arriving behind two backlogs is served at the next take
    assert _order(r, 4)[0] == "c"


def test_a_lone_tenant_and_keyless_messages_are_taken_whole_and_in_order():
    import fakeredis

    r = fakeredis.FakeRedis()
    _push(r, None, ["p0", "p1"])
    assert _order(r, 10) == "pp" and r.zcard(keys.fair_ring(Q)) == 0  # keyless only: the plain list, no ring
    _push(r, "A", [f"a{i}" for i in range(5)])
    _push(r, None, ["p2"])
    items = [item for _, _, item in _take(r, keys.priority_lists(Q), 10)]
    assert sorted(items) == [b"a0", b"a1", b"a2", b"a3", b"a4", b"p2"]
    assert [i for i in items if i.startswith(b"a")] == [b"a0", b"a1", b"a2", b"a3", b"a4"]  # FIFO per tenant
    assert r.zcard(keys.fair_ring(Q)) == 0  # emptied tenants leave the ring


def test_online_goes_before_backfill_across_tenants():
    import fakeredis

    r = fakeredis.FakeRedis()
    backfill = keys.backfill_queue("m")
    _push(r, "A", ["x0", "x1"], queue=backfill)
    _push(r, "B", ["o0"])
    lists = keys.priority_lists(Q) + keys.priority_lists(backfill)
    assert _order(r, 2, lists) == "ox"


def test_the_doorbell_rings_on_a_push_and_is_cleared_by_a_take_that_empties_the_queue():
    import fakeredis

    r = fakeredis.FakeRedis()
    bell = keys.bell_key(Q)
    assert bell == keys.bell_key(keys.backfill_queue("m"))  # one bell per model
    _push(r, "A", ["a0", "a1", "a2"])
    assert r.llen(bell) == 1
    _take(r, keys.priority_lists(Q), 2)
    assert r.llen(bell) == 1  # stopped at its credit: items may be left for other workers
    _take(r, keys.priority_lists(Q), 2)
    assert r.llen(bell) == 0  # found fewer than it could hold: an idle worker blocks on the bell
    _push(r, "A", ["a3"])
    assert r.llen(bell) == 1  # a push onto an empty list rings
    r.delete(bell)
    _push(r, "A", ["a4"])
    assert r.llen(bell) == 0  # onto a list holding messages: rung for already (or its take rang)
    _push(r, "B", ["b0"], queue=keys.backfill_queue("m"))
    assert r.llen(bell) == 1  # another list of the model, empty before: rings the model's one bell


def test_a_message_restored_onto_an_empty_list_rings_the_doorbell():
    import fakeredis

    r = fakeredis.FakeRedis()
    for queue in (Q, keys.backfill_queue("m")):
        _push(r, "A", ["a0"], queue=queue)
        (key, tag, _), = _take(r, [keys.tenant_list(queue, "A")], 5)
        assert r.llen(keys.bell_key(Q)) == 0
        assert taking.RESTORE(r, [keys.UNACKED_KEY, keys.UNACKED_INDEX_KEY], [tag, 0]) == 1
        assert r.lrange(key, 0, -1) == [b"a0"] and r.llen(keys.bell_key(Q)) == 1
        r.delete(key, keys.bell_key(Q))


def test_a_push_over_its_limit_is_refused_whole_and_a_restore_puts_the_tenant_back_in_the_ring():
    import fakeredis

    r = fakeredis.FakeRedis()
    assert _push(r, "A", ["a0", "a1"], limit=3) == 0
    assert _push(r, "A", ["a2", "a3"], limit=3) == 4  # would hold 4: nothing pushed
    assert r.llen(keys.tenant_list(Q, "A")) == 2
    (_, tag, _), (_, _, _) = _take(r, keys.priority_lists(Q), 5)
    assert r.zcard(keys.fair_ring(Q)) == 0
    assert r.eval(taking.RESTORE_SCRIPT, 2, keys.UNACKED_KEY, keys.UNACKED_INDEX_KEY, tag, 0) == 1
    assert r.zrange(keys.fair_ring(Q), 0, -1) == [b"A"]
    assert _order(r, 5) == "a"


def test_depths_count_tenants_lists():
    import fakeredis

    r = fakeredis.FakeRedis()
    _push(r, "A", ["a0", "a1"])
    _push(r, None, ["p0"])
    depths = taking.read_depths([Q], taking.DEPTH(r, *taking.depth_call([Q])))
    assert depths == {Q: (3, {"A": 2})}


def test_the_scripts_run_on_fakeredis_too():
    import fakeredis

    r = fakeredis.FakeRedis()
    r.lpush(Q, b"a")
    (_, tag, item), = _take(r, [Q], 2)
    assert item == b"a" and r.eval(taking.RESTORE_SCRIPT, 2, keys.UNACKED_KEY, keys.UNACKED_INDEX_KEY, tag, 0) == 1
    assert r.lrange(Q, 0, -1) == [b"a"]


def test_split_held_tells_our_records_from_kombus():
    assert taking.split_held(taking.held_record("vela2.m", b"{}")) == ("vela2.m", b"{}")
    assert taking.split_held(json.dumps([{"body": ""}, "", "vela2.m"]).encode()) is None
    assert taking.version_problem("6.0.16") and taking.version_problem("6.2.14") is None
    assert taking.version_problem("7.4.1") is None and taking.version_problem("weird") is None


