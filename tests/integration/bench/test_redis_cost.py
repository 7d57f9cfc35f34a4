"""bench.redis_cost end to end on tiny counts: every path measured, the figures sane, the goals
beside them (what the benchmark's JSON promises its readers)."""

from __future__ import annotations

import json


def test_redis_cost_measures_every_path_with_a_real_worker(demo_dir, tmp_path):
    from bench import redis_cost

    cache = tmp_path / "cache"
    cache.mkdir()
    (cache / "demo").symlink_to(demo_dir)  # the tests' demo checkpoint instead of training one
    out = tmp_path / "cost.json"
    assert redis_cost.main(["--n", "40", "--n-one", "10", "--idle-s", "1", "--cache-dir", str(cache),
                            "--out", str(out)]) == 0
    got = json.loads(out.read_text())
    paths = got["paths"]
    for name, n in (("submit_result_queued", 40), ("one_at_a_time", 10), ("submit_many_16", 40)):
        p = paths[name]
        assert p["requests"] == n and p["commands_per_request"] > 3 and p["cpu_us_per_request"] > 0, p
        assert "evalsha" in p["top_commands_per_request"] or "set" in p["top_commands_per_request"]
    assert paths["submit_result_queued"]["result_value_bytes"] > 100
    idle = paths["idle_worker"]
    assert idle["commands_per_s"] < 100 and "worker_cpu_us_per_s" in idle  # a waiting worker, not a polling one
    assert set(got["goals"]) == {"submit_result_queued cpu µs", "submit_result_queued commands", "one_at_a_time cpu µs",
                                 "idle_worker cpu µs/s (less Redis alone)", "stored bytes per short answer"}
    assert got["redis"]["appendonly"] == "yes" and got["command"].startswith("python -m bench.redis_cost")
