"""The in-flight checks' CPU per chunk without the network (#36 item 5): `python -m bench.inflight_micro`.

200 streams of 1,500 chunks (three quarters reasoning, then content) fed through StreamAccumulator.feed and
LiveStream.seen after every chunk (one event per read, as on a quiet machine), with a board that judges
(JudgeRules()) against one that does not; process CPU time per chunk, three alternations.
"""

from __future__ import annotations

import random
import time

from synthwatch.capture.stream import StreamAccumulator
from synthwatch.quality.inflight import JudgeRules
from synthwatch.workers.inflight import StreamBoard

WORDS = ["alpha ", "beta ", "gamma ", "delta ", "x = 3 ", "so ", "the ", "answer ", "is ", "\n"]


def chunks(n: int, seed: int = 1) -> list[dict[str, object]]:
    rnd = random.Random(seed)
    return [{"id": "c", "object": "chat.completion.chunk", "created": 1, "model": "m",
             "choices": [{"index": 0, "delta": {"reasoning" if i < n * 3 // 4 else "content": rnd.choice(WORDS)},
                          "finish_reason": None}]} for i in range(n)]


def per_chunk_us(judged: bool, cs: list[dict[str, object]], streams: int = 200) -> float:
    board = StreamBoard(JudgeRules() if judged else None, lambda _v: None)
    t = time.process_time()
    for r in range(streams):
        acc = StreamAccumulator("auto", "<think>", "</think>", False)
        live = board.open(r, "e")
        for c in cs:
            acc.feed(c)
            live.seen(acc)
        board.close(live)
    return (time.process_time() - t) / (streams * len(cs)) * 1e6


def main() -> None:
    cs = chunks(1500)
    for _ in range(3):
        on, off = per_chunk_us(True, cs), per_chunk_us(False, cs)
        print(f"checks on {on:.3f} µs per chunk, off {off:.3f}, the checks {on - off:.3f}", flush=True)


if __name__ == "__main__":
    main()
