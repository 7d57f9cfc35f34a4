"""When a load run sends: Poisson arrivals at a set rate, open loop, over several client processes
(each a Poisson stream of rate / processes: together one of the whole rate), and the closed-loop
capacity probe. A process runs one asyncio loop; every request is sent at its due time whether or
not earlier ones were answered, and its latency counts from that due time (so a client running late
cannot hide the server's queueing: the lag is reported beside)."""

from __future__ import annotations

import asyncio
import dataclasses
import multiprocessing as mp
import random
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from typing import Any

from producer.loadtest.drivers import HttpDriver, RedisDriver
from producer.loadtest.report import Outcome
from producer.loadtest.workload import requests

START_LEAD_S = 3.0  # the processes start together this long after the plan is made (spawning takes ~1 s)


@dataclass(frozen=True)
class Target:
    """Where requests go: `redis_url` (AsyncClient) or `http_url` (the route), for `model`."""

    model: str
    redis_url: str | None = None
    http_url: str | None = None
    api_key: str | None = None
    tenant: str | None = None
    backfill: bool = False
    timeout_s: float = 60.0

    def driver(self) -> Any:
        if self.http_url:
            return HttpDriver(self.http_url, timeout_s=self.timeout_s, api_key=self.api_key)
        return RedisDriver(self.redis_url or "redis://127.0.0.1:6379/0", self.model, timeout_s=self.timeout_s,
                           backfill=self.backfill, tenant=self.tenant)


@dataclass(frozen=True)
class Plan:
    """What one client process runs: requests of `workload` to `target` at `rate` requests/s
    (`per_message` to a message), a warm-up then a measured window, from wall-clock `start_at`."""

    target: Target
    workload: str
    prefix: str
    seed: int
    rate: float
    per_message: int
    warmup_s: float
    duration_s: float
    start_at: float  # time.time() of the first arrival's earliest moment (every process the same)


async def _open_loop(plan: Plan) -> list[Outcome]:
    rng = random.Random(plan.seed)
    source = requests(plan.workload, plan.target.model, plan.prefix, plan.seed)
    loop_start = time.monotonic() + max(0.0, plan.start_at - time.time())
    measured_from = loop_start + plan.warmup_s
    end = measured_from + plan.duration_s
    outcomes: list[Outcome] = []

    async def one(group: list[dict[str, Any]], due: float) -> None:
        lag = time.monotonic() - due
        for got in await driver.send(group):
            if due >= measured_from:
                latency = None if got.at is None else got.at - due
                outcomes.append(Outcome(due - measured_from, lag, latency, got.status, got.timings))

    async with plan.target.driver() as driver:
        tasks = []
        due = loop_start
        while True:
            due += rng.expovariate(plan.rate / plan.per_message)  # messages arrive at rate / per_message
            if due >= end:
                break
            await asyncio.sleep(max(0.0, due - time.monotonic()))
            tasks.append(asyncio.create_task(one([next(source) for _ in range(plan.per_message)], due)))
        await asyncio.gather(*tasks)
    return outcomes


async def _closed_loop(plan: Plan, in_flight: int) -> tuple[int, float]:
    """(answers, seconds) of a flood keeping `in_flight` requests outstanding, counted after a ramp
    of plan.warmup_s, over plan.duration_s."""
    source = requests(plan.workload, plan.target.model, plan.prefix, plan.seed)
    begin = time.monotonic() + max(0.0, plan.start_at - time.time())
    await asyncio.sleep(max(0.0, begin - time.monotonic()))
    count_from, end = begin + plan.warmup_s, begin + plan.warmup_s + plan.duration_s
    answered = 0

    async def worker() -> None:
        nonlocal answered
        while time.monotonic() < end:
            for got in await driver.send([next(source) for _ in range(plan.per_message)]):
                if got.at is not None and count_from <= got.at <= end and got.status == "ok":
                    answered += 1

    async with plan.target.driver() as driver:
        await asyncio.gather(*(worker() for _ in range(max(1, in_flight // plan.per_message))))
    return answered, plan.duration_s


async def _one_at_a_time(plan: Plan, n: int) -> list[Outcome]:
    """`n` requests, each sent once the one before is answered: the latency of a request alone."""
    source = requests(plan.workload, plan.target.model, plan.prefix, plan.seed)
    outcomes = []
    async with plan.target.driver() as driver:
        start = time.monotonic()
        for _ in range(n):
            due = time.monotonic()
            for got in await driver.send([next(source) for _ in range(plan.per_message)]):
                latency = None if got.at is None else got.at - due
                outcomes.append(Outcome(due - start, 0.0, latency, got.status, got.timings))
    return outcomes


def run_sequential(plan: Plan, n: int) -> list[Outcome]:
    """The outcomes of `n` requests sent one at a time (one client, nothing else in flight)."""
    return asyncio.run(_one_at_a_time(plan, n))


def _run_open(plan: Plan) -> list[Outcome]:
    return asyncio.run(_open_loop(plan))


def _run_closed(args: tuple[Plan, int]) -> tuple[int, float]:
    return asyncio.run(_closed_loop(*args))


def _plans(base: Plan, processes: int) -> list[Plan]:
    start_at = time.time() + START_LEAD_S
    return [dataclasses.replace(base, rate=base.rate / processes, prefix=f"{base.prefix}p{i}-",
                                seed=base.seed * 1000 + i, start_at=start_at) for i in range(processes)]


def run_point(base: Plan, processes: int) -> list[Outcome]:
    """The measured outcomes of `base.rate` requests/s over `processes` client processes."""
    if processes <= 1:
        return _run_open(_plans(base, 1)[0])
    with ProcessPoolExecutor(processes, mp_context=mp.get_context("spawn")) as pool:
        parts = list(pool.map(_run_open, _plans(base, processes)))
    return [o for part in parts for o in part]


def measure_capacity(base: Plan, processes: int, in_flight: int) -> float:
    """Answers per second while `in_flight` requests are kept outstanding (closed loop): what the
    deployment carries at saturation."""
    plans = _plans(base, max(1, processes))
    share = max(1, in_flight // len(plans))
    if len(plans) == 1:
        got = [_run_closed((plans[0], share))]
    else:
        with ProcessPoolExecutor(len(plans), mp_context=mp.get_context("spawn")) as pool:
            got = list(pool.map(_run_closed, [(p, share) for p in plans]))
    return sum(a for a, _ in got) / base.duration_s
