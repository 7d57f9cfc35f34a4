"""What a batch costs the device, learned from the batches that ran: seconds = a + b x tokens (a
fixed cost per batch, a cost per padded token), fitted by least squares with exponential forgetting
(the last HALF_LIFE batches weigh half), seeded by the warm-up's batches. The scheduler asks it when
a running batch will end (to stage the next one just before) and how many tokens fit in a time
(settings.target_p99_ms); how long the device runner takes to launch a batch (its `lead`); and how
far off its predictions have been (`error_s`): the next batch is staged that much earlier, since a
batch staged late leaves the device idle while one staged early only misses the last arrivals."""

from __future__ import annotations

import math
from collections.abc import Iterable

HALF_LIFE = 64  # batches after which an observation weighs half
_DECAY = 0.5 ** (1 / HALF_LIFE)
MIN_LEAD_S = 0.002  # the least lead assumed: a batch's trip to the device runner


class BatchCost:
    """Device seconds of a batch of `tokens` padded tokens (a + b x tokens), and the runner's lead."""

    def __init__(self, seed: Iterable[tuple[int, float]] = ()):
        self._w = self._x = self._y = self._xx = self._xy = 0.0  # decayed sums of 1, x, y, x^2, xy
        self.a, self.b = 0.0, 0.0
        self.lead_s = MIN_LEAD_S
        self.error_s = 0.0  # mean |observed - predicted| seconds of recent batches (weighted 0.2 each)
        self.observed = 0
        for tokens, seconds in seed:
            self.observe(tokens, seconds)

    def observe(self, tokens: int, seconds: float, launch_s: float | None = None) -> None:
        """A batch of `tokens` padded tokens ran `seconds` on the device (its launch took `launch_s`)."""
        if tokens <= 0 or not seconds >= 0 or not math.isfinite(seconds):
            return
        x, y = float(tokens), float(seconds)
        if self.observed:
            self.error_s = 0.8 * self.error_s + 0.2 * abs(y - self.seconds(tokens))
        self._w = self._w * _DECAY + 1
        self._x = self._x * _DECAY + x
        self._y = self._y * _DECAY + y
        self._xx = self._xx * _DECAY + x * x
        self._xy = self._xy * _DECAY + x * y
        self.observed += 1
        self._fit()
        if launch_s is not None and launch_s >= 0:
            self.lead_s = max(MIN_LEAD_S, 0.8 * self.lead_s + 0.2 * launch_s)

    def _fit(self) -> None:
        spread = self._w * self._xx - self._x * self._x  # (sum of weights)^2 x the variance of x
        if spread > 1e-9 * self._w * self._xx:
            b = (self._w * self._xy - self._x * self._y) / spread
            a = (self._y - b * self._x) / self._w
        else:  # every batch of one size so far: all of it per token
            a, b = 0.0, self._y / self._x
        if b < 0:  # noise on near-equal sizes: no cost per token is no model; fall back to proportional
            a, b = 0.0, self._y / self._x
        self.a, self.b = max(0.0, a), b

    def seconds(self, tokens: int) -> float:
        """Predicted device seconds of a batch of `tokens` padded tokens (0 before anything ran)."""
        return self.a + self.b * max(0, tokens)

    def tokens_within(self, seconds: float) -> int | None:
        """The most padded tokens a batch may have to run within `seconds` (None: not known yet)."""
        if self.observed == 0 or self.b <= 0:
            return None
        return max(1, int((seconds - self.a) / self.b))
