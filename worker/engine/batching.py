"""Length buckets and token-budget batches, pure (no Redis, no model): the engine's packing policy.

Sequences wait in buckets of similar length (edges 4 per power of two, so padding inside a bucket
wastes under 25%). A bucket yields a batch when its padded tokens reach `max_batch_tokens` (a full
batch), when its oldest sequence has waited `max_wait_s` (then the bucket empties, oldest batch
first), or, when the scheduler says online work goes now (`online_now`: the device is free and no
company is on its way, or the running batch is about to end), when it holds an online sequence.
Among ready batches, one holding an online request (priority 0) goes before backfill-only ones
(priority 1), then the one whose oldest sequence waited longest. A pop may take a smaller budget
than `max_batch_tokens` (the scheduler's latency target). Batches are packed with
`vela2.text.packing.pack`, the one implementation of the budget rule:
padded cost = longest x count <= max_batch_tokens; a sequence over the budget runs alone.

Fair share across tenants (flows): each waiting sequence belongs to a flow (its tenant; '' for
keyless producers) with a weight. A flow's `served` counts the tokens / weight it was handed since
it last had nothing waiting; a flow that starts waiting again starts just under the least served
flow waiting (so it goes next, as in start-time fair queueing). Among ready batches the one holding
the least served flow goes first (after online-before-backfill), and a bucket holding several flows
forms its batch from its sequences in fair order (the least served flow's oldest first, each pick
charged to its flow), so a tenant's backlog, however long, does not hold back another's requests
beyond one batch. With one flow waiting, everything is as without flows. `contended` tells the
scheduler when two or more tenants share the device (it then keeps batches short:
worker.engine.scheduler).

Row packing (`row_tokens` R set): several short sequences share one row of R tokens, so length no
longer sets the padding and every sequence waits in one shared bucket; batches are packed by
`vela2.text.packing.pack(..., row_tokens=R)` (rows x R <= max_batch_tokens), and a batch
is full when one more sequence as long as its longest would need a further batch.
"""

from __future__ import annotations

import heapq
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import Generic, TypeVar

from vela2.text.packing import pack

T = TypeVar("T")

FAIR_WINDOW_S = 10.0  # a flow that sent a sequence this recently is active
MIN_BUCKET_TOKENS = 16  # every sequence up to this length shares the first bucket
BUCKET_STEPS = 4  # bucket edges per power of two (edge ratio <= 1.25)


def bucket_of(tokens: int, min_tokens: int = MIN_BUCKET_TOKENS, steps: int = BUCKET_STEPS) -> int:
    """The bucket (its upper edge, in tokens) of a sequence of `tokens` tokens.

    Edges: min_tokens, then `steps` equal steps inside each power of two (16, 20, 24, 28, 32, 40, ...).
    """
    if tokens <= min_tokens:
        return min_tokens
    base = 1 << ((tokens - 1).bit_length() - 1)  # largest power of two below `tokens`
    step = max(1, base // steps)
    return base + -(-(tokens - base) // step) * step


@dataclass
class Waiting(Generic[T]):
    """One sequence waiting for a batch."""

    value: T
    tokens: int
    since: float  # when its request arrived (monotonic seconds): the wait counts from there
    priority: int = 0  # 0 online, 1 backfill: lower goes first among ready batches
    flow: str = ""  # its tenant ('' keyless): the fair share it is run in


class Buckets(Generic[T]):
    """Waiting sequences by length bucket; `pop_batch` hands out the most urgent ready batch."""

    def __init__(self, max_batch_tokens: int, max_wait_s: float, row_tokens: int | None = None):
        """`row_tokens`: pack several short sequences per row of this many tokens (None: one per row)."""
        if max_batch_tokens < 1:
            raise ValueError(f"max_batch_tokens must be >= 1; got {max_batch_tokens}")
        if max_wait_s < 0:
            raise ValueError(f"max_wait_s must be >= 0; got {max_wait_s}")
        if row_tokens is not None and row_tokens < 1:
            raise ValueError(f"row_tokens must be >= 1 (or None: one sequence per row); got {row_tokens}")
        self.row_tokens = row_tokens
        self.max_batch_tokens = max_batch_tokens
        self.max_wait_s = max_wait_s
        self._buckets: dict[int, list[Waiting[T]]] = {}
        self.online = 0  # waiting sequences of priority 0
        self.weights: dict[str, float] = {}  # a flow's weight in the fair share (absent: 1)
        self._served: dict[str, float] = {}  # tokens / weight handed to each flow with sequences waiting
        self._waiting: Counter[str] = Counter()  # sequences waiting per flow
        self._seen: dict[str, float] = {}  # flow -> when its latest sequence arrived (`since`)

    def __len__(self) -> int:
        return sum(len(b) for b in self._buckets.values())

    def add(self, value: T, tokens: int, since: float, priority: int = 0, flow: str = "") -> None:
        """Queue one sequence of `tokens` tokens whose request arrived at `since`, in `flow`'s share."""
        key = 0 if self.row_tokens else bucket_of(tokens)  # packed rows: one shared bucket
        self._buckets.setdefault(key, []).append(Waiting(value, tokens, since, priority, flow))
        self.online += priority == 0
        if not self._waiting[flow]:  # starts waiting: just under the least served flow waiting
            self._served[flow] = min(self._served.values(), default=1.0) - 1.0
        self._waiting[flow] += 1
        self._seen[flow] = max(since, self._seen.get(flow, since))

    def contended(self, now: float) -> bool:
        """Whether the device is shared by flows: two or more sent sequences in the last FAIR_WINDOW_S."""
        self._seen = {f: t for f, t in self._seen.items() if now - t <= FAIR_WINDOW_S}
        return len(self._seen) >= 2

    def _urgency(self, batch: list[Waiting[T]]) -> tuple[int, float, float]:
        """Sort key of a candidate batch: online before backfill, then the least served flow in it,
        then the longest wait."""
        return (min(w.priority for w in batch), min(self._served[w.flow] for w in batch),
                min(w.since for w in batch))

    def _gone(self, w: Waiting[T], handed: bool) -> None:
        """`w` left the buckets (`handed`: in a batch, charged to its flow)."""
        self.online -= w.priority == 0
        self._waiting[w.flow] -= 1
        if not self._waiting[w.flow]:
            del self._waiting[w.flow], self._served[w.flow]
        elif handed:
            self._served[w.flow] += w.tokens / self.weights.get(w.flow, 1.0)

    def _fair_prefix(self, items: list[Waiting[T]], budget: int) -> list[int]:
        """Indices of a bucket's sequences in fair order (online first; then the least served flow,
        each flow's oldest first, each pick charged to its flow), as many as could fill one batch."""
        lanes: dict[tuple[int, str], list[int]] = {}  # (priority, flow) -> its sequences, oldest last
        for i in sorted(range(len(items)), key=lambda i: items[i].since, reverse=True):
            lanes.setdefault((items[i].priority, items[i].flow), []).append(i)
        served = {f: self._served[f] for _, f in lanes}
        heap = [(p, served[f], items[ix[-1]].since, f) for (p, f), ix in lanes.items()]
        heapq.heapify(heap)
        out: list[int] = []
        tokens = 0
        while heap and tokens < budget:
            p, _, _, f = heapq.heappop(heap)
            i = lanes[p, f].pop()
            out.append(i)
            tokens += items[i].tokens
            served[f] += items[i].tokens / self.weights.get(f, 1.0)
            if lanes[p, f]:
                heapq.heappush(heap, (p, served[f], items[lanes[p, f][-1]].since, f))
        return out

    def next_deadline(self) -> float | None:
        """When the oldest waiting sequence reaches max_wait (None when nothing waits)."""
        oldest = [min(w.since for w in b) for b in self._buckets.values() if b]
        return min(oldest) + self.max_wait_s if oldest else None

    def _full(self, batch: list[Waiting[T]], budget: int) -> bool:
        longest = max(w.tokens for w in batch)
        if self.row_tokens:
            # rows are planned first-fit: ask the packer whether one more as long still fits
            return len(pack([w.tokens for w in batch] + [longest], budget, self.row_tokens)) > 1
        return longest * (len(batch) + 1) > budget  # no room for one more as long

    def _may_fill(self, items: list[Waiting[T]], budget: int) -> bool:
        """Cheap test before packing: could these sequences fill a batch at all?"""
        if self.row_tokens:
            # First-fit leaves at most one row half empty or worse, so n sequences (plus the one
            # more of `_full`) need at most 2 x tokens / capacity + 1 rows: fewer than a batch holds
            # means no batch of them can be full yet.
            longest = max(w.tokens for w in items)
            capacity = max(self.row_tokens, longest)
            per_batch = max(1, budget // capacity)
            return 2 * (sum(w.tokens for w in items) + longest) / capacity + 1 > per_batch
        return max(w.tokens for w in items) * len(items) >= budget

    def _candidate(self, items: list[Waiting[T]], ready: bool, budget: int) -> list[int] | None:
        """Indices (into `items`) of the batch this bucket would hand out now, or None. `ready`: the
        bucket may go as it is (old enough, flushed, or online work that goes now); else only a full
        batch goes."""
        if not ready and not self._may_fill(items, budget):
            return None  # neither full nor ready: keep waiting for company
        pool = list(range(len(items)))
        if len({w.flow for w in items}) > 1:  # several tenants: the batch comes from the fair order's head
            pool = self._fair_prefix(items, budget)
        batches = [[pool[j] for j in b] for b in pack([items[i].tokens for i in pool], budget, self.row_tokens)]
        if not ready:
            batches = [b for b in batches if self._full([items[i] for i in b], budget)]
        if not batches:
            return None
        return min(batches, key=lambda b: self._urgency([items[i] for i in b]))

    def pop_batch(self, now: float, *, flush: bool = False, full_only: bool = False, online_now: bool = False,
                  budget: int | None = None) -> list[T] | None:
        """Remove and return the most urgent ready batch (its oldest sequence waited longest), or
        None when no bucket is ready. `flush`: every bucket counts as old (shutdown); `full_only`:
        age makes no bucket ready (the next batch queued behind a running one); `online_now`: a
        bucket holding an online sequence is ready; `budget`: padded tokens of this batch (default,
        and at most, max_batch_tokens)."""
        budget = self.max_batch_tokens if budget is None else max(1, min(budget, self.max_batch_tokens))
        best: tuple[tuple[int, float, float], int, list[int]] | None = None
        for key, items in self._buckets.items():
            if not items:
                continue
            aged = not full_only and (flush or min(w.since for w in items) + self.max_wait_s <= now)
            ready = aged or (online_now and any(w.priority == 0 for w in items))
            chosen = self._candidate(items, ready, budget)
            if chosen is None:
                continue
            urgency = self._urgency([items[i] for i in chosen])
            if best is None or urgency < best[0]:
                best = (urgency, key, chosen)
        if best is None:
            return None
        _, key, chosen = best
        items = self._buckets[key]
        taken = set(chosen)
        batch = [items[i].value for i in chosen]
        for i in chosen:
            self._gone(items[i], handed=True)
        self._buckets[key] = [w for i, w in enumerate(items) if i not in taken]
        if not self._buckets[key]:
            del self._buckets[key]
        return batch

    def remove(self, keep: Callable[[T], bool]) -> list[T]:
        """Drop every waiting value for which `keep` is False; returns the dropped values."""
        dropped: list[T] = []
        for key in list(self._buckets):
            kept: list[Waiting[T]] = []
            for w in self._buckets[key]:
                if keep(w.value):
                    kept.append(w)
                else:
                    dropped.append(w.value)
                    self._gone(w, handed=False)
            if kept:
                self._buckets[key] = kept
            else:
                del self._buckets[key]
        return dropped

    def drain(self) -> list[T]:
        """Remove and return everything waiting."""
        out = [w.value for b in self._buckets.values() for w in b]
        self._buckets.clear()
        self.online = 0
        self._served.clear()
        self._waiting.clear()
        return out
