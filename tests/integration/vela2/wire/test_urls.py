"""vela2 backfill run as a process takes the Redis URL from a file (no password in argv)."""

from __future__ import annotations


def test_backfill_takes_the_url_from_a_file(tmp_path, capsys, redis_server, redis_url):
    """End to end through `vela2 backfill`'s main: the file names the live Redis (the flag a dead
    one), and the row is queued there (no worker: it times out into an error line)."""
    import json

    from producer.backfill import main
    from vela2.wire.keys import backfill_queue

    f = tmp_path / "url"
    f.write_text(redis_url + "\n")
    inp, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    row = {"id": "a", "task": "choice:x", "text": "t", "questions": [{"options": ["a", "b"]}]}
    inp.write_text(json.dumps(row) + "\n")
    args = [str(inp), str(out), "--model", "m", "--redis", "redis://127.0.0.1:1/0", "--timeout-s", "1"]
    assert main([*args, "--redis-url-file", str(f)]) == 0
    assert json.loads(out.read_text())["error"]["type"] == "timeout"
    client = redis_server.client()
    try:
        assert client.llen(backfill_queue("m")) == 1
    finally:
        client.close()
    assert main([str(inp), str(tmp_path / "o2"), "--redis-url-file", str(tmp_path / "nope")]) == 2
    assert "cannot read the Redis URL file" in capsys.readouterr().err


