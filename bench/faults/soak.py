"""The soak (`--soak-minutes N`, `make soak MINUTES=N`): steady traffic on one worker for N minutes,
sampling its RSS and GPU memory (from /metrics) every few seconds, then every request read back."""

from __future__ import annotations

import re
import time
import urllib.request
from typing import Any

from bench.faults.accounting import Tracker, drained
from bench.faults.context import MODEL, QUEUE, Suite, round1
from bench.faults.traffic import good_rows
from producer.client import Client


def _gpu_memory(port: int) -> dict[str, float] | None:
    """vela2_gpu_memory_bytes by kind (MiB) from the worker's /metrics; None on a CPU worker."""
    try:
        text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2).read().decode()
    except OSError:
        return None
    found = {
        m.group(1): float(m.group(2)) / 2**20
        for m in re.finditer(r'^vela2_gpu_memory_bytes\{[^}]*kind="(\w+)"[^}]*\} (\S+)$', text, re.M)
    }
    return found or None


def run_soak(s: Suite, minutes: float, sample_s: float = 5.0) -> dict[str, Any]:
    """Steady traffic for `minutes` on one worker; samples its RSS and GPU memory every `sample_s`."""
    r = s.redis()
    rc = r.client()
    w = s.worker(r.url(), metrics=True).wait_ready()
    tr = Tracker(r.url())
    client = Client(r.url(), model=MODEL)
    samples: list[dict[str, Any]] = []
    t0 = time.monotonic()
    end = t0 + minutes * 60
    next_sample = t0
    i = 0
    try:
        while time.monotonic() < end:
            if len(tr.ids) - tr.answered() < 64:  # keep ~64 in flight: steady, not a growing backlog
                rows = good_rows("soak", 16, start=i)
                i += 16
                tr.add(client.submit_many(rows))
            tr.poll()
            if time.monotonic() >= next_sample:
                samples.append(
                    {
                        "t_s": round(time.monotonic() - t0, 1),
                        "rss_mb": round1(w.rss_mb()),
                        "gpu_mb": _gpu_memory(w.metrics_port),
                        "answered": tr.answered(),
                        "queue": int(rc.llen(QUEUE)),
                    }
                )
                next_sample += sample_s
            time.sleep(0.05)
        done = tr.wait(120, until=lambda: drained(rc))
        code = w.terminate()
        f = tr.final()
        rss = [x["rss_mb"] for x in samples if x["rss_mb"] is not None]
        third = max(1, len(rss) // 3)
        return {
            "minutes": minutes,
            "requests": f["requests"],
            "answered_ok": f["answered_ok"],
            "answered_error": f["answered_error"],
            "lost": f["lost"],
            "drained": done,
            "worker_exit": code,
            "requests_per_s": round(f["requests"] / max(1e-9, minutes * 60), 1),
            "rss_mb": {
                "first": rss[0] if rss else None,
                "last": rss[-1] if rss else None,
                "max": max(rss) if rss else None,
                "growth_last_third_vs_first_third": round(sum(rss[-third:]) / third - sum(rss[:third]) / third, 1)
                if rss
                else None,
            },
            "gpu": "from /metrics vela2_gpu_memory_bytes" if any(x["gpu_mb"] for x in samples) else None,
            "samples": samples,
        }
    finally:
        client.close()
        tr.close()
        s.cleanup()


# --- the suite -------------------------------------------------------------------------------------
