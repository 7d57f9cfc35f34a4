"""Scenarios that LPUSH raw Redis list items no producer of ours would send: items that are no
message of ours at all (`queue_items`: headers as a list, unknown encodings, 100,000-deep JSON,
protocol 1, forged headers naming other requests' ids, ...; over redis:// and again over rediss://
when redis-server has TLS), and request ids Redis cannot take as keys (`bad_id`: lone surrogates).
The worker's channel takes each apart before kombu and Celery see it: the worker stays up, every
id found gets an error naming the problem, the rest goes to the dead-letter list with a reason."""

from __future__ import annotations

import base64
import json
import shutil
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import redis as redis_lib

from bench.faults.accounting import Tracker, classify, drained, error_message, unacked
from bench.faults.context import (
    MODEL,
    QUEUE,
    SETTLE_TIMEOUT_S,
    Suite,
    log_problems,
    start_ready,
    stop_all,
    worker_counts,
    worker_notes,
)
from bench.faults.report import Outcome
from bench.faults.traffic import DEEP, good_row, good_rows, raw_message, set_body
from producer.client import Client
from stack.harness import RedisServer
from vela2.wire import keys
from vela2.wire.messages import MAX_JSON_DEPTH, build_message


def scenario_queue_items(s: Suite, out: Outcome) -> None:
    """Raw queue items that are no message of ours, LPUSHed among good traffic: envelope headers as
    a list, an unknown body_encoding, an envelope nested 100,000 deep, non-JSON bytes, a Celery
    protocol-1 message, a headerless envelope, a body that is not base64, a header id that differs
    from the body id, a message naming celery.backend_cleanup, chunks whose `vela2_ids` header
    names other requests' ids, a forged `vela2_refused` header. The worker's channel takes each
    apart before kombu and Celery see it: the worker stays up, every id found in an item gets an
    error naming the problem, items with no usable id go to the dead-letter list with a reason,
    ids only a header names get nothing (real requests under them later get real answers), and
    everything is acked. Run over redis:// and again over rediss:// (TLS) when this redis-server
    build has TLS."""
    _run_queue_items(s, out, s.redis(), "plain")
    if shutil.which("openssl") is None:
        out.skip("the same items over rediss:// (TLS)", "no openssl on PATH to make the certificates")
        return
    try:
        tls = s.redis(kind=TlsRedisServer)
    except RuntimeError as e:
        last = s.last_started()
        why = tls_refusal(last) if isinstance(last, RedisServer) else None
        if why is None:
            raise  # TLS is built in but the server did not start: a failure, not a skip
        out.skip("the same items over rediss:// (TLS)", f"{why} ({str(e)[:200]})")
        return
    out.notes["tls"] = "redis-server --port 0 --tls-port P with a self-signed CA (openssl); the worker's URL is " \
        "rediss://127.0.0.1:P/0?ssl_cert_reqs=required&ssl_ca_certs=<ca.pem>"
    _run_queue_items(s, out, tls, "tls")


def _run_queue_items(s: Suite, out: Outcome, r: RedisServer, label: str) -> None:
    """Push the raw items of _queue_items on `r`, with good traffic, to one worker; check them."""
    rc = r.client(socket_timeout=10)
    w = s.worker(r.url()).wait_ready()
    pid = w.pid
    tr = Tracker(r.url())
    prefix = f"qi{label}"
    items, errors, dead_want, victims = _queue_items(prefix)
    good = good_rows(f"{prefix}-good", s.n(40, minimum=10))
    oks = [x["id"] for x in good] + [f"{prefix}-chunk-a", f"{prefix}-chunk-b", f"{prefix}-forged"]
    tr.add(oks + list(errors))
    payloads = [build_message([x], QUEUE).payload.encode() for x in good]
    mixed = payloads[: len(payloads) // 2] + [raw for _, raw in items] + payloads[len(payloads) // 2 :]
    rc.lpush(QUEUE, *mixed)
    done = tr.wait(SETTLE_TIMEOUT_S, until=lambda: drained(rc))
    tag = f"[{label}] "
    out.check(tag + "all answered, queue and unacked empty (everything acked)", done,
              {"missing": tr.missing()[:10], "queue": rc.llen(QUEUE), "unacked": unacked(rc)})
    out.check(tag + "the worker stayed up (same pid, never exited)", w.alive() and w.pid == pid, w.pid)
    raws = {i: rc.get(keys.result_key(i)) for i in oks + list(errors) + victims}
    dead = _check_items(out, tag, rc, raws, oks, errors, dead_want, victims)
    problems = log_problems(w)
    out.check(tag + "no safety-net log lines (engine loop errors, tracebacks)", not problems, problems)
    # the ids only a header named are free: real requests under them get their real answers
    client = Client(r.url(), model=MODEL)
    tr.add(client.submit_many([good_row(v, i) for i, v in enumerate(victims)]))
    client.close()
    got = tr.wait(120, until=lambda: drained(rc))
    out.check(tag + "real requests under those ids afterwards get their real ok answers",
              got and all(classify(tr.first.get(v)) == "ok" for v in victims),
              {v: classify(tr.first.get(v)) for v in victims})
    out.check(tag + "the worker is still the same process at the end", w.alive() and w.pid == pid)
    stop_all([w], out)
    body_ids_unanswered = [f"{prefix}-hlist", f"{prefix}-nohead"]
    out.notes[label] = {
        "redis_url": r.url().split("?")[0],
        "items": [name for name, _ in items],
        "item_bytes": {name: len(raw) for name, raw in items},
        "error_answers": {rid: (error_message(raws[rid]) or "")[:160] for rid in errors},
        "dead_letter_reasons": [str(d.get("reason"))[:160] for d in dead],
        "body_ids_of_dead_lettered_items_answered": {
            i: rc.get(keys.result_key(i)) is not None for i in body_ids_unanswered
        },
        **worker_notes([w]),
    }
    out.add(tr)
    tr.close()


def _check_items(out: Outcome, tag: str, rc: redis_lib.Redis, raws: dict[str, bytes | None], oks: list[str],
                 errors: dict[str, str], dead_want: dict[str, str], victims: list[str]) -> list[dict[str, Any]]:
    """The checks of what became of the raw items: errors under every id found, ok answers for the
    good ones, nothing under ids only a header named, the dead-letter list; returns its entries."""
    wrong = {}
    for rid, words in errors.items():
        msg = error_message(raws[rid])
        if classify(raws[rid]) != "error" or words not in str(msg):
            wrong[rid] = msg
    out.check(tag + "every id found in an item got an error naming the problem", not wrong, wrong)
    out.check(tag + "the good requests and the good chunk's rows answered ok",
              all(classify(raws[i]) == "ok" for i in oks),
              {i: classify(raws[i]) for i in oks if classify(raws[i]) != "ok"})
    touched = {v: error_message(raws[v]) or "stored" for v in victims if raws[v] is not None}
    out.check(tag + "ids only a header named got nothing stored", not touched, touched)
    dead = [json.loads(x) for x in rc.lrange(keys.dead_letter(MODEL), 0, -1)]
    missing_dead = {name: words for name, words in dead_want.items()
                    if not any(words in str(d.get("reason")) and d.get("item") is not None for d in dead)}
    out.check(tag + "every item with no usable id is on the dead-letter list with its reason", not missing_dead,
              {"missing": missing_dead, "reasons": [str(d.get("reason"))[:100] for d in dead]})
    out.check(tag + "nothing else on the dead-letter list", len(dead) == len(dead_want), len(dead))
    return dead


EMBED = {"callbacks": None, "errbacks": None, "chain": None, "chord": None}  # a Celery body's third part


@dataclass
class RawItems:
    """Raw queue items and what each must get: (name, raw item) pairs, the ids that must get an
    error (id -> words its message must contain), the items that must be dead-lettered (name ->
    words of the reason)."""

    items: list[tuple[str, bytes]] = field(default_factory=list)
    errors: dict[str, str] = field(default_factory=dict)
    dead: dict[str, str] = field(default_factory=dict)

    def add(self, name: str, item: dict[str, Any] | str | bytes) -> None:
        raw = item if isinstance(item, bytes) else (item if isinstance(item, str) else json.dumps(item)).encode()
        self.items.append((name, raw))


def _queue_items(prefix: str) -> tuple[list[tuple[str, bytes]], dict[str, str], dict[str, str], list[str]]:
    """The raw items of scenario_queue_items: (name, raw item) pairs, the ids that must get an
    error (id -> words its message must contain), the items that must be dead-lettered (name ->
    words of the reason), and the victim ids that only a header names."""
    c = RawItems()
    _broken_envelopes(prefix, c)
    victims = _misleading_ids(prefix, c)
    return c.items, c.errors, c.dead, victims


def _broken_envelopes(p: str, c: RawItems) -> None:
    """Envelopes kombu could not take apart: headers as a list or none, an unknown body encoding,
    JSON nested 100,000 deep, bytes that are not JSON, a protocol-1 message, a body not base64."""
    base = good_row("x", 0)
    add, errors, dead = c.add, c.errors, c.dead
    env = raw_message([{**base, "id": f"{p}-hlist"}])
    env["headers"] = [[k, v] for k, v in env["headers"].items()]
    add("headers_list", env)
    errors[f"{p}-hlist"] = "envelope headers must be an object; got list"  # its body still names its request

    env = raw_message([{**base, "id": f"{p}-enc"}])
    env["properties"]["body_encoding"] = "rot13"
    add("unknown_body_encoding", env)
    errors[f"{p}-enc"] = "body_encoding 'rot13' is not base64"

    head = json.dumps({"headers": {"id": f"{p}-deep", "task": keys.TASK_NAME}, "properties": {"delivery_tag": "t"},
                       "body": ""})
    deep = head[:-1] + ', "x": ' + "[" * DEEP + "]" * DEEP + "}"
    add("envelope_nested_100000", deep)
    dead["envelope_nested_100000"] = f"nested deeper than {MAX_JSON_DEPTH} levels"

    add("not_json", b"\x00\xff\xfe not JSON at all \x80\x81")
    dead["not_json"] = "not valid JSON"

    proto1 = {"task": keys.TASK_NAME, "id": f"{p}-proto1", "args": [{**base, "id": f"{p}-proto1"}], "kwargs": {}}
    add("protocol_1", {"body": base64.b64encode(json.dumps(proto1).encode()).decode(), "content-encoding": "utf-8",
                       "content-type": "application/json",
                       "properties": {"body_encoding": "base64", "delivery_tag": f"{p}-tag-proto1",
                                      "delivery_info": {"exchange": "", "routing_key": QUEUE}, "priority": 0}})
    errors[f"{p}-proto1"] = "protocol 1"

    env = raw_message([{**base, "id": f"{p}-nohead"}])
    del env["headers"]
    add("headerless", env)
    errors[f"{p}-nohead"] = "envelope headers must be an object; got NoneType"

    env = raw_message([{**base, "id": f"{p}-b64"}])
    env["body"] = "@@@ this is not base64 @@@"
    add("body_not_base64", env)
    errors[f"{p}-b64"] = "not valid base64"


def _misleading_ids(p: str, c: RawItems) -> list[str]:
    """Items whose ids mislead: a header id that differs from the body's, a Celery built-in task,
    chunks whose `vela2_ids` header names other requests, a forged `vela2_refused` header. Returns
    the victim ids that only a header names."""
    base = good_row("x", 0)
    add, errors = c.add, c.errors
    env = raw_message([{**base, "id": f"{p}-mm-body"}])
    env["headers"]["id"] = f"{p}-mm-head"
    add("header_id_differs_from_body_id", env)
    errors[f"{p}-mm-head"] = errors[f"{p}-mm-body"] = "differs from its message id"

    env = raw_message([{**base, "id": f"{p}-cleanup"}])
    env["headers"]["task"] = "celery.backend_cleanup"
    set_body(env, json.dumps([[], {}, EMBED]).encode())
    add("celery_backend_cleanup", env)
    errors[f"{p}-cleanup"] = "'celery.backend_cleanup' is not served here"

    victims = [f"{p}-victim-{i}" for i in range(4)]
    env = raw_message([{**base, "id": f"{p}-chunk-a"}, good_row(f"{p}-chunk-b", 1)], chunk=True)
    env["headers"]["vela2_ids"] = victims[:2]
    add("chunk_naming_other_ids", env)  # a good chunk: its own rows answered ok, the header ignored

    env = raw_message([{**base, "id": f"{p}-badchunk-a"}], chunk=True)
    env["headers"]["vela2_ids"] = victims[2:]
    set_body(env, json.dumps([[[{**base, "id": f"{p}-badchunk-a"}]], {"chunk": True, "bogus": 1}, EMBED]).encode())
    add("bad_chunk_naming_other_ids", env)
    errors[env["headers"]["id"]] = errors[f"{p}-badchunk-a"] = "unknown keyword arguments ['bogus']"

    env = raw_message([good_row(f"{p}-forged", 2)])
    env["headers"]["vela2_refused"] = "forged by a producer"
    env["headers"]["vela2_refused_ids"] = victims
    add("forged_refused_header", env)  # only the worker's channel may set it: answered as a normal request
    return victims


class TlsRedisServer(RedisServer):
    """A redis-server that listens on a TLS port only (`--port 0 --tls-port P`), with a CA and a
    server certificate for 127.0.0.1 made by openssl in its directory; its URL is
    rediss://127.0.0.1:P/0?ssl_cert_reqs=required&ssl_ca_certs=<ca.pem>."""

    def start(self, timeout_s: float = 20.0) -> RedisServer:
        self.ca = self.workdir / "ca.pem"
        if not self.ca.exists():
            make_certificates(self.workdir)
        return super().start(timeout_s)

    def url(self, db: int = 0) -> str:
        return f"rediss://127.0.0.1:{self.port}/{db}?ssl_cert_reqs=required&ssl_ca_certs={self.workdir / 'ca.pem'}"

    def client(self, db: int = 0, **kw: Any) -> Any:
        return redis_lib.Redis(host="127.0.0.1", port=self.port, db=db, ssl=True, ssl_cert_reqs="required",
                               ssl_ca_certs=str(self.workdir / "ca.pem"), **kw)

    def command(self) -> list[str]:
        cmd = super().command()
        cmd[cmd.index("--port") + 1] = "0"
        d = self.workdir
        return [*cmd, "--tls-port", str(self.port), "--tls-cert-file", str(d / "server.pem"), "--tls-key-file",
                str(d / "server.key"), "--tls-ca-cert-file", str(d / "ca.pem"), "--tls-auth-clients", "no"]


def make_certificates(d: Path) -> None:
    """A self-signed CA (ca.pem) and a server certificate for IP 127.0.0.1 signed by it (server.pem,
    server.key), with openssl; RuntimeError naming what failed."""
    (d / "san.cnf").write_text("subjectAltName=IP:127.0.0.1\n")
    steps = [
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "ca.key", "-out", "ca.pem",
         "-days", "2", "-subj", "/CN=vela2-bench-ca"],
        ["openssl", "req", "-newkey", "rsa:2048", "-nodes", "-keyout", "server.key", "-out", "server.csr",
         "-subj", "/CN=127.0.0.1"],
        ["openssl", "x509", "-req", "-in", "server.csr", "-CA", "ca.pem", "-CAkey", "ca.key", "-CAcreateserial",
         "-out", "server.pem", "-days", "2", "-extfile", "san.cnf"],
    ]
    for cmd in steps:
        p = subprocess.run(cmd, cwd=d, capture_output=True, text=True, timeout=60)
        if p.returncode != 0:
            raise RuntimeError(f"{' '.join(cmd[:2])} failed: {p.stderr.strip()[-300:]}")


def tls_refusal(r: RedisServer) -> str | None:
    """Why a TLS redis-server did not start, when its log says the build has no TLS (else None)."""
    text = (r.workdir / "redis.log").read_text(errors="replace") if (r.workdir / "redis.log").exists() else ""
    low = text.lower()
    if "tls" in low and ("bad directive" in low or "not supported" in low or "not compiled" in low):
        return f"this redis-server build has no TLS: {text.strip().splitlines()[-1][:200]}"
    return None

def _lone_surrogate_message(rid: str, rows: list[dict[str, Any]] | None = None) -> str:
    """A raw queue item whose header id (and body row ids) may hold lone surrogates, written as
    JSON escapes ("\\ud800"): what a producer that never checks ids could LPUSH. `rows`: a chunk."""
    if rows is None:
        env = raw_message([good_row("placeholder", 0)])
        body: list[Any] = [[{**good_row("x", 0), "id": rid}], {}, EMBED]
    else:
        env = raw_message([good_row("placeholder", 0)], chunk=True)
        body = [[rows], {"chunk": True}, EMBED]
        rid = env["headers"]["id"]
    env["headers"]["id"] = env["headers"]["root_id"] = env["properties"]["correlation_id"] = rid
    set_body(env, json.dumps(body, ensure_ascii=True).encode("ascii"))
    return json.dumps(env, ensure_ascii=True)


BAD_ROW = "badrow-\ud800"  # bad_id: the chunk's bad row


def _bad_id_items(out: Outcome, mates: list[dict[str, Any]]) -> tuple[str, str, str]:
    """bad_id's raw items: a message with id 'bad-\\ud800', and a chunk with one row BAD_ROW among
    `mates` (checked to carry the surrogate as a JSON escape); returns both and the chunk's id."""
    single = _lone_surrogate_message("bad-\ud800")
    chunk = _lone_surrogate_message("", rows=[*mates[:2], {**good_row("x", 1), "id": BAD_ROW}, *mates[2:]])
    chunk_id = json.loads(chunk)["headers"]["id"]
    chunk_body = base64.b64decode(json.loads(chunk)["body"]).decode("ascii")
    out.check("the raw items carry the surrogate as a JSON escape (header id, body ids)",
              '"bad-\\ud800"' in single and "\\ud800" in base64.b64decode(json.loads(single)["body"]).decode("ascii")
              and '"badrow-\\ud800"' in chunk_body)
    return single, chunk, chunk_id


def _check_bad_id_dead_letters(out: Outcome, rc: redis_lib.Redis, chunk_id: str) -> list[dict[str, Any]]:
    """The bad message and the chunk's bad row are on the dead-letter list with their reason, and
    nothing else is; returns its entries."""
    dead = [json.loads(x) for x in rc.lrange(keys.dead_letter(MODEL), 0, -1)]
    item_entry = next((d for d in dead if d.get("item") and "ud800" in d["item"]), None)
    row_entry = next((d for d in dead if (d.get("request") or {}).get("id") == BAD_ROW), None)
    out.check("the bad message is on the dead-letter list with its reason",
              item_entry is not None and "not valid Unicode" in str(item_entry.get("reason")),
              item_entry and item_entry.get("reason"))
    out.check("the chunk's bad row is on the dead-letter list with its reason",
              row_entry is not None and "not valid Unicode" in str(row_entry.get("reason"))
              and row_entry.get("message_id") == chunk_id,
              row_entry and row_entry.get("reason"))
    out.check("nothing else on the dead-letter list", len(dead) == 2, len(dead))
    return dead


def scenario_bad_id(s: Suite, out: Outcome) -> None:
    """Request ids Redis cannot take as keys, among ~300 innocent requests on 2 workers: a raw
    message whose header id and body id hold a lone surrogate ("\\ud800", a JSON escape in a raw
    LPUSH), and a chunk with one such row. The bad item and the bad row go to the dead-letter list
    with their reason; every innocent request is answered; no worker stops storing: all done well
    within the visibility timeout, with nothing redelivered."""
    r = s.redis()
    rc = r.client()
    vis = max(120.0, s.visibility_for(2048))
    workers = start_ready(s, 2, r.url(), visibility_timeout_s=vis, max_buffered=8)
    tr = Tracker(r.url())
    n = s.n(300, minimum=20)
    innocents = good_rows("innocent", n)
    mates = good_rows("chunkmate", 4, start=n)
    single, chunk, chunk_id = _bad_id_items(out, mates)
    tr.add([x["id"] for x in innocents + mates])
    first = [build_message([x], QUEUE).payload for x in innocents[: n // 4]]
    rest = [build_message([x], QUEUE).payload for x in innocents[n // 4 :]]
    t0 = time.monotonic()
    rc.lpush(QUEUE, *first, single, chunk, *rest)  # BRPOP takes them in this order
    done = tr.wait(SETTLE_TIMEOUT_S, until=lambda: drained(rc))
    took = time.monotonic() - t0
    out.check("all answered and the queue drained", done)
    out.check("all done well within the visibility timeout (under half of it)", took < vis / 2,
              f"{took:.1f} s of {vis:g} s")
    out.check("both workers stayed up", all(w.alive() for w in workers))
    summary = rc.get(keys.result_key(chunk_id))
    out.check("the chunk's summary is stored under its id", summary is not None and classify(summary) == "ok",
              summary[:200] if summary else None)
    dead = _check_bad_id_dead_letters(out, rc, chunk_id)
    problems = [p for w in workers for p in log_problems(w)]
    out.check("no safety-net log lines (engine loop errors, tracebacks)", not problems, problems)
    stop_all(workers, out)
    per_worker = [worker_counts(w) or {} for w in workers]
    notes = worker_notes(workers)
    out.check("every worker kept storing (each answered some) and nothing was redelivered",
              all(c.get("answered", 0) > 0 for c in per_worker) and notes.get("duplicates_skipped") == 0
              and notes.get("answered") == n + len(mates),
              [{k: c.get(k) for k in ("answered", "duplicates_skipped", "returned")} for c in per_worker])
    out.notes.update(
        {
            "injected": "a raw message with header id and body id 'bad-\\ud800' and a chunk with one row "
            f"'badrow-\\ud800' ({len(mates)} innocent chunk mates), pushed after {n // 4} innocent requests",
            "visibility_timeout_s": vis,
            "seconds_to_answer_all": round(took, 1),
            "dead_letter_reasons": [d.get("reason") for d in dead],
            "per_worker_answered": [c.get("answered") for c in per_worker],
            **notes,
        }
    )
    out.settle(tr)
    out.check("every innocent answer ok", out.answered_ok == out.requests, out.answered_ok)
    tr.close()

