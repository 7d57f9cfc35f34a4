"""`vela2 status`: the one screen an operator reads first. For each model (every model with a queue,
a dead letter or a live or starting worker in this Redis, or those named by --model): its queues'
depths (online, backfill, dead letters), its workers still starting (loading the model:
worker.runtime.announce) and its live workers, each named by its Celery node name (the worker's
--hostname, as Flower shows it) with its device, precision, checkpoint
digest, batches per second, held messages, answers by status and failures by reason (from the
description every worker rewrites with its heartbeat, vela2.wire.fleet); then the messages held by
workers of any model (kombu's unacked hash). `--tenants` adds, per model, each tenant's messages
waiting (online, backfill), its weight in the fair share, its live bulk jobs and their lines (as the
live_jobs / job_lines quotas count them) and the bytes its stored results hold (results are not
per model: the same figure under each model; keyless producers are tenant "(keyless)"). Tenants
listed: those with messages waiting, a share set, live jobs or stored results. `--json` prints the same as one JSON
object.

With `--cells FILE` (vela2.wire.cells) it reads every cell and merges: queue depths, dead letters and
tenants' figures summed, every cell's workers (each marked with its cell), one line per cell (its
share of slots, up or DOWN).

Exit status: 0; 2 for bad arguments; 3 when Redis does not answer (one line naming the URL,
password masked); with --cells, 3 when any cell did not answer (the others' status is printed).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import time
from typing import Any

import redis

from producer.client import DEFAULT_REDIS_URL
from producer.quotas import QUOTA_PREFIX, job_lines_key, jobs_key
from vela2.cli import Parser
from vela2.wire import fleet, keys, usage
from vela2.wire.cells import ENV_CELLS_FILE, CellMap, cells_file_from_env, load_cells
from vela2.wire.connections import redis_client
from vela2.wire.urls import ENV_BROKER_URL, add_url_arguments, mask_url, url_from_args

EXIT_REDIS_UNAVAILABLE = 3
SCAN_COUNT = 1000  # keys per SCAN step while looking for models


def models_in(client: Any) -> list[str]:
    """Every model this Redis knows: one with a queue, a dead-letter list or a heartbeat set (of live
    or starting workers)."""
    found: set[str] = set()
    for raw in client.scan_iter(match=f"{keys.QUEUE_PREFIX}*", count=SCAN_COUNT):
        name = (raw.decode() if isinstance(raw, bytes) else raw)[len(keys.QUEUE_PREFIX):]
        name = name.split(keys.KOMBU_PRIORITY_SEP)[0]
        for suffix in (keys.BACKFILL_SUFFIX, keys.DEAD_SUFFIX):
            name = name.removesuffix(suffix)
        found.add(name)
    for prefix in (keys.WORKERS_PREFIX, keys.STARTING_PREFIX):
        for raw in client.scan_iter(match=f"{prefix}*", count=SCAN_COUNT):
            found.add(_text(raw)[len(prefix):])
    return sorted(m for m in found if m)


def starting_workers(client: Any, model_name: str, now: float | None = None) -> list[dict[str, Any]]:
    """{"worker": node name, "beat_at"} of `model_name`'s workers still starting (a starting beat at
    most fleet.STALE_S old), oldest beat first."""
    now = time.time() if now is None else now
    return [{"worker": _text(w), "beat_at": float(at)} for w, at in
            client.zrangebyscore(keys.starting_key(model_name), now - fleet.STALE_S, "+inf", withscores=True)]


def gather(client: Any, models: list[str] | None = None, broker: Any = None, tenants: bool = False) -> dict[str, Any]:
    """The status as JSON-able data: {"models": {name: {"queues", "dead", "workers", "starting"[, "tenants"]}},
    "unacked"}. `client`: the result store (dead letters, heartbeats, quotas); `broker`: the Redis the
    queues live in (default `client`), or a RabbitMQ URL (ready messages only; "unacked" is then
    None; no tenant's messages are told apart there). `tenants`: add each model's per-tenant usage."""
    broker = client if broker is None else broker
    amqp = isinstance(broker, str)
    names = models or models_in(client)
    out: dict[str, Any] = {"at": time.time(), "models": {}}
    unacked: int | None = None
    for name in names:
        queues = keys.queues(name)
        by_tenant: dict[str, dict[str, int]] = {q: {} for q in queues}
        if amqp:
            depths = fleet.amqp_queue_depths(broker, queues)
        else:
            depths, by_tenant = fleet.depths(broker, queues)
        unacked = depths.get(keys.UNACKED_KEY)
        out["models"][name] = {
            "queues": {"online": depths[keys.online_queue(name)], "backfill": depths[keys.backfill_queue(name)]},
            "dead": int(client.llen(keys.dead_letter(name))),
            "workers": fleet.live_workers(client, name),
            "starting": starting_workers(client, name),
        }
        if tenants:
            out["models"][name]["tenants"] = tenant_usage(client, None if amqp else broker, name, by_tenant)
    out["unacked"] = unacked if names or amqp else int(broker.hlen(keys.UNACKED_KEY))
    return out


def _connect(url: str) -> Any:
    return redis_client(url, socket_timeout=10, socket_connect_timeout=10)


def _broker(url: str | None) -> Any:
    """The broker argument of `gather` for a broker URL: None, a RabbitMQ URL as is, or a Redis client."""
    if url and keys.is_amqp_url(url):
        return url
    return _connect(url) if url else None


def gather_cells(cell_map: CellMap, models: list[str] | None = None, tenants: bool = False) -> dict[str, Any]:
    """`gather` of every cell of `cell_map` (vela2.wire.cells), merged: per model the queues, dead
    letters and tenants' figures summed and the workers of all cells (each with its "cell"); "unacked"
    summed; "cells": per cell its name, URL (masked), share of slots and "up" (False with "error" for
    a cell that did not answer: the figures are then those of the cells that did)."""
    out: dict[str, Any] = {"at": time.time(), "models": {}, "unacked": 0, "cells": []}
    for cell, about in zip(cell_map.cells, cell_map.describe(), strict=True):
        client = _connect(cell.url)
        try:
            one = gather(client, models, _broker(cell.broker_url), tenants=tenants)
        except (redis.exceptions.RedisError, OSError) as e:
            out["cells"].append({**about, "up": False, "error": f"{type(e).__name__}: {e}"})
            continue
        finally:
            client.close()
        out["cells"].append({**about, "up": True})
        out["unacked"] = None if one["unacked"] is None or out["unacked"] is None else out["unacked"] + one["unacked"]
        for name, m in one["models"].items():
            merged = out["models"].setdefault(name, {"queues": {"online": 0, "backfill": 0}, "dead": 0, "workers": [],
                                                     "starting": []})
            for q in ("online", "backfill"):
                merged["queues"][q] += m["queues"][q]
            merged["dead"] += m["dead"]
            merged["workers"] += [{**w, "cell": cell.name} for w in m["workers"]]
            merged["starting"] += [{**w, "cell": cell.name} for w in m["starting"]]
            for tenant, u in m.get("tenants", {}).items():
                into = merged.setdefault("tenants", {}).setdefault(tenant, {**u, **dict.fromkeys(SUMMED, 0)})
                for k in SUMMED:
                    into[k] += u[k]
    return out


SUMMED = ("online", "backfill", "live_jobs", "job_lines", "stored_bytes")  # a tenant's figures added over cells


def tenant_usage(client: Any, broker: Any, model: str, by_tenant: dict[str, dict[str, int]]) -> dict[str, Any]:
    """Per tenant: messages waiting online and backfill, its share (weight; the Redis broker holds
    them, else the store), its live bulk jobs and their lines (the live_jobs / job_lines quotas'
    counts: jobs of every model) and its stored bytes (vela2.wire.usage; "" is keyless producers)."""
    online, backfill = by_tenant[keys.online_queue(model)], by_tenant[keys.backfill_queue(model)]
    shares = {_text(k): float(v) for k, v in (broker or client).hgetall(keys.TENANT_SHARES_KEY).items()}
    jobs = {_text(k)[len(QUOTA_PREFIX):].rsplit(":", 1)[0]
            for k in client.scan_iter(match=jobs_key("*"), count=SCAN_COUNT)}
    live = {t: live_jobs(client, t) for t in jobs}
    holders = {_text(k)[len(keys.STORED_PREFIX):] for k in client.scan_iter(match=keys.stored_key("*"),
                                                                            count=SCAN_COUNT)}
    stored = {t: usage.stored_bytes(client, t) for t in holders}
    names = sorted(set(online) | set(backfill) | set(shares) | {t for t, n in live.items() if n[0]}
                   | {t for t, n in stored.items() if n})
    return {t or "(keyless)": {"online": online.get(t, 0), "backfill": backfill.get(t, 0), "share": shares.get(t, 1.0),
                               "live_jobs": live.get(t, (0, 0))[0], "job_lines": live.get(t, (0, 0))[1],
                               "stored_bytes": stored.get(t, 0)} for t in names}


def live_jobs(client: Any, tenant: str) -> tuple[int, int]:
    """(jobs, lines) of a tenant's live-jobs set (producer.quotas) that exist and have not ended (the
    set keeps ended ones until the tenant's next job sweeps them)."""
    members = [_text(m) for m in client.zrange(jobs_key(tenant), 0, -1)]
    lines = client.hmget(job_lines_key(tenant), members) if members else []
    pipe = client.pipeline(transaction=False)
    for m in members:
        pipe.exists(m)
        pipe.hexists(m, "status")
    got = pipe.execute() if members else []
    live = [i for i in range(len(members)) if got[2 * i] and not got[2 * i + 1]]
    return len(live), sum(int(lines[i] or 0) for i in live)


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def render(status: dict[str, Any]) -> str:
    """The status as the screen `vela2 status` prints."""
    lines = [f"reading {status['redis']}"] if "redis" in status else []
    lines += [f"cell {c['cell']} ({c['url']}): {c['slots_share']:.1%} of slots | "
             + ("up" if c["up"] else f"DOWN: {c['error']} (its figures are missing below)")
             for c in status.get("cells", [])]
    if not status["models"]:
        lines.append("no model has a queue or a live worker in this Redis")
    for name, m in status["models"].items():
        q = m["queues"]
        starting = m.get("starting") or []
        lines.append(f"{name}: online {q['online']:,} | backfill {q['backfill']:,} | dead letters {m['dead']:,} | "
                     f"live workers {len(m['workers'])}" + (f" | starting {len(starting)}" if starting else ""))
        digests = {w.get("digest") for w in m["workers"] if w.get("digest")}
        if len(digests) > 1:
            lines.append(f"  MIXED: {len(digests)} checkpoint digests serve this model name")
        for w in m["workers"]:
            rate = w.get("batches_per_s")
            cell = f"[{w['cell']}] " if "cell" in w else ""
            answered = w.get("answered") or {}
            failures = w.get("failures") or {}
            lines.append(
                f"  {cell}{w['worker']}: {w.get('device', '?')} {w.get('precision', '?')} digest "
                f"{(w.get('digest') or '?')[:12]} | {'?' if rate is None else f'{rate:.2f}'} batches/s | "
                f"held {w.get('held', '?')} | answered "
                + (", ".join(f"{k} {v:,}" for k, v in sorted(answered.items())) or "none")
                + (" | failures " + ", ".join(f"{k} {v:,}" for k, v in sorted(failures.items())) if failures else "")
            )
        for w in starting:
            cell = f"[{w['cell']}] " if "cell" in w else ""
            lines.append(f"  {cell}{w['worker']}: starting (loading the model; requests wait for it)")
        if "tenants" in m:
            none = " (none with messages waiting, a share, live jobs or stored results)"
            lines.append(f"  tenants: {len(m['tenants'])}" + ("" if m["tenants"] else none))
            for t, u in m["tenants"].items():
                lines.append(f"    {t}: online {u['online']:,} | backfill {u['backfill']:,} | share {u['share']:g} | "
                             f"live jobs {u['live_jobs']:,} ({u['job_lines']:,} lines) | "
                             f"stored {u['stored_bytes']:,} bytes")
    held = status["unacked"]
    lines.append(f"held by workers of any model (unacked): {'not told by RabbitMQ' if held is None else f'{held:,}'}")
    return "\n".join(lines)


def build_parser() -> argparse.ArgumentParser:
    """The `vela2 status` arguments."""
    ap = Parser(prog="vela2 status", description=__doc__.splitlines()[0])
    add_url_arguments(ap, DEFAULT_REDIS_URL)
    ap.add_argument("--broker", default=os.environ.get(ENV_BROKER_URL) or None,
                    help=f"the workers' broker when it is not the Redis of --redis: another Redis, or RabbitMQ "
                         f"(amqp://) (default ${ENV_BROKER_URL})")
    ap.add_argument("--model", action="append", default=None,
                    help="only this model (repeatable); default every model found in this Redis")
    ap.add_argument("--tenants", action="store_true",
                    help="add each tenant's messages waiting, share and live jobs (per model)")
    ap.add_argument("--cells", default=cells_file_from_env(),
                    help=f"a cells file (vela2.wire.cells; default ${ENV_CELLS_FILE}): every cell's status, merged; "
                         "--redis and --broker are then not read")
    ap.add_argument("--json", action="store_true", help="print one JSON object instead of the screen")
    return ap


def main(argv: list[str] | None = None) -> int:
    """queues, live workers and failures at a glance"""
    args = build_parser().parse_args(argv)
    if args.cells:
        status = gather_cells(load_cells(args.cells), args.model, tenants=args.tenants)
        print(json.dumps(status, indent=1) if args.json else render(status))
        return EXIT_REDIS_UNAVAILABLE if not all(c["up"] for c in status["cells"]) else 0
    url = url_from_args(args.redis, args.redis_url_file, sys.argv[1:] if argv is None else argv,
                        logging.getLogger("vela2.status"))
    client, broker = _connect(url), _broker(args.broker)
    try:
        status = gather(client, args.model, broker, tenants=args.tenants)
    except redis.exceptions.RedisError as e:
        print(f"vela2 status: Redis at {mask_url(url)} (or the broker) did not answer: {e}", file=sys.stderr)
        return EXIT_REDIS_UNAVAILABLE
    except OSError as e:  # RabbitMQ refused or away (kombu raises socket errors)
        print(f"vela2 status: the broker at {mask_url(args.broker)} did not answer: {e}", file=sys.stderr)
        return EXIT_REDIS_UNAVAILABLE
    status["redis"] = mask_url(url)  # which Redis this is (the default, 127.0.0.1:6379, unless given)
    print(json.dumps(status, indent=1) if args.json else render(status))
    return 0


if __name__ == "__main__":  # from a checkout that is not installed (no entry points): python -m ...
    sys.exit(main())
