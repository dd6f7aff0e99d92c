"""A mergeable histogram with fixed log-spaced buckets, for latency percentiles in the time series.

Fixed bounds make sketches from different workers and intervals addable; serialised as a sparse
``"i:count,..."`` string so a series row stays small.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

RATIO = 1.25
LAT_MIN_S = 0.005  # latency and TTFT buckets: 5 ms ... ~ 10^4 s
TPS_MIN = 0.5  # tokens/s buckets: 0.5 ... ~ 10^6
N_BUCKETS = 72


def bucket_of(value: float, minimum: float) -> int:
    if value <= minimum:
        return 0
    i = int(math.log(value / minimum, RATIO)) + 1
    return i if i < N_BUCKETS else N_BUCKETS - 1


def upper_bound(i: int, minimum: float) -> float:
    return minimum * RATIO**i


class Sketch:
    __slots__ = ("counts", "minimum")

    def __init__(self, minimum: float = LAT_MIN_S) -> None:
        self.minimum = minimum
        self.counts: dict[int, int] = {}

    def add(self, value: float) -> None:
        i = bucket_of(value, self.minimum)
        self.counts[i] = self.counts.get(i, 0) + 1

    def merge_text(self, text: str) -> None:
        if not text:
            return
        for part in text.split(","):
            i, _, c = part.partition(":")
            k = int(i)
            self.counts[k] = self.counts.get(k, 0) + int(c)

    def to_text(self) -> str:
        return ",".join(f"{i}:{c}" for i, c in sorted(self.counts.items()))

    @property
    def n(self) -> int:
        return sum(self.counts.values())

    def quantile(self, q: float) -> float | None:
        total = self.n
        if total == 0:
            return None
        rank = q * total
        seen = 0
        for i in sorted(self.counts):
            seen += self.counts[i]
            if seen >= rank:
                # geometric middle of the bucket: error is bounded by the bucket ratio
                lo = upper_bound(i - 1, self.minimum) if i > 0 else 0.0
                hi = upper_bound(i, self.minimum)
                return math.sqrt(lo * hi) if lo > 0 else hi
        return upper_bound(max(self.counts), self.minimum)

    def quantiles(self, qs: Iterable[float]) -> list[float | None]:
        return [self.quantile(q) for q in qs]
