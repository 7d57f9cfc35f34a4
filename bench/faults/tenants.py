"""One tenant exhausts its quotas through the HTTP route while another keeps sending: the noisy
tenant is refused (429 quota_exceeded naming the quota; nothing written for a refused request),
every request either tenant had accepted is answered, and the quiet tenant is never refused."""

from __future__ import annotations

import dataclasses
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx

from bench.faults.accounting import Tracker, drained
from bench.faults.context import MODEL, SETTLE_TIMEOUT_S, Suite, start_ready, stop_all, worker_notes
from bench.faults.report import Outcome
from producer.auth import new_key
from producer.quotas import Quotas
from stack.harness import start_route
from vela2.wire.keys import scoped_id, submitted_key

NOISY_QUOTAS = Quotas(requests_per_s=40, queued=30)


def _request(rid: str, i: int) -> dict[str, Any]:
    return {"model": MODEL, "id": rid, "input": {"user": f"Order {i} has not arrived. Where is my refund?"},
            "tasks": [{"name": "intent", "kind": "choice", "question": "What does the user want?",
                       "options": ["refund", "other"]}]}


def _keys(s: Suite) -> tuple[str, dict[str, dict[str, str]]]:
    """A keys file with `noisy` (NOISY_QUOTAS) and `quiet` (no quota); its path and each one's headers."""
    lines, headers = [], {}
    for tenant, quotas in (("noisy", NOISY_QUOTAS), ("quiet", None)):
        key, entry = new_key(tenant)
        lines.append(dataclasses.replace(entry, quotas=quotas).line())
        headers[tenant] = {"Authorization": f"Bearer {key}"}
    path = s.workdir / "keys.jsonl"
    path.write_text("\n".join(lines) + "\n")
    return str(path), headers


def scenario_tenant_quota(s: Suite, out: Outcome) -> None:
    """noisy floods POST /v1/system_one from 8 connections (no wait) past its requests_per_s and
    queued quotas; quiet sends one request at a time, waiting for each answer, meanwhile."""
    r = s.redis()
    rc = r.client()
    workers = start_ready(s, 1, r.url())
    path, headers = _keys(s)
    proc, base = start_route(r.url(), MODEL, s.workdir / "route.log", "--api-keys-file", path)
    tr = Tracker(r.url())
    n_noisy, n_quiet = s.n(600), s.n(40)
    codes: dict[str, int] = {}
    try:
        with httpx.Client(base_url=base, timeout=60) as http, ThreadPoolExecutor(8) as pool:
            def noisy(i: int) -> tuple[int, dict[str, Any]]:
                got = http.post("/v1/system_one", json=_request(f"n-{i}", i), params={"wait_s": 0},
                                headers=headers["noisy"])
                return got.status_code, got.json()

            flood = [pool.submit(noisy, i) for i in range(n_noisy)]
            quiet: list[tuple[int, str | None, float]] = []
            for i in range(n_quiet):
                t0 = time.monotonic()
                got = http.post("/v1/system_one", json=_request(f"q-{i}", i), params={"wait_s": 30},
                                headers=headers["quiet"])
                quiet.append((got.status_code, got.json().get("status"), time.monotonic() - t0))
            noisy_got = [f.result() for f in flood]
    finally:
        proc.terminate()
        proc.wait(30)
    for code, _ in noisy_got:
        codes[str(code)] = codes.get(str(code), 0) + 1
    accepted = [f"n-{i}" for i, (code, _) in enumerate(noisy_got) if code in (200, 202)]
    refused = [(f"n-{i}", body) for i, (code, body) in enumerate(noisy_got) if code == 429]
    tr.add([scoped_id("noisy", rid) for rid in accepted] + [scoped_id("quiet", f"q-{i}") for i in range(n_quiet)])
    done = tr.wait(SETTLE_TIMEOUT_S, until=lambda: drained(rc))
    stop_all(workers, out)
    quotas_named = {body.get("error", {}).get("message", "").split(" of this tenant")[0] for _, body in refused}
    latencies = sorted(t for _, _, t in quiet)
    out.notes.update({"noisy": {"sent": n_noisy, "by_status": codes, "refused_quotas": sorted(quotas_named)},
                      "quiet": {"sent": n_quiet, "p50_ms": round(1e3 * latencies[len(latencies) // 2], 1),
                                "max_ms": round(1e3 * latencies[-1], 1)},
                      **worker_notes(workers)})
    out.check("noisy was refused past its quotas (429 quota_exceeded) and let in up to them",
              bool(refused) and bool(accepted) and all(b.get("error", {}).get("type") == "quota_exceeded"
                                                       for _, b in refused), codes)
    out.check("nothing was written for a refused request (no submitted marker)",
              not any(rc.exists(submitted_key(scoped_id("noisy", rid))) for rid, _ in refused))
    out.check("quiet was never refused: every request answered ok within its wait",
              all(code == 200 and status == "ok" for code, status, _ in quiet),
              [x for x in quiet if x[0] != 200 or x[1] != "ok"][:5])
    out.check("every accepted request answered and the queues drained", done)
    out.settle(tr)
