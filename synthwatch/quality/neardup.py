"""Near-duplicate checks (#30, #38): datasketch MinHash over shingles chosen by script, scoped by prompt.

- ``near_duplicate`` (across prompts): an answer fails when it is a near-duplicate of an earlier answer of
  *another* prompt, or of a row of the existing dataset given with ``--dedup-against`` (synthwatch.quality.
  dedup_index). The k samples of one prompt are not compared with each other here.
- ``near_duplicate_in_prompt`` (within a prompt): a sample fails when it is a near-duplicate of an earlier sample
  of the *same* prompt (k samples that do not vary). With k = 1 it always passes.

Shingles: text is cut into tokens, a word of a script written with spaces (Latin, Cyrillic, Greek, Arabic, Hangul,
...) or one character of a script written without them (Han, Hiragana, Katakana, Thai, Lao, Khmer, Myanmar,
Tibetan); a shingle is ``shingle_size`` consecutive tokens. So a Chinese paragraph is shingled by characters and an
English one by words, in the same text too; two small edits give a similarity of the same order in both. The
index holds at most ``max_records`` answers; it runs in the worker's verdict thread (synthwatch.quality.extended),
never in the writer thread.
"""

from __future__ import annotations

import re
from collections import OrderedDict
from typing import Any

from ..check_catalog import NEAR_DUPLICATE, NEAR_DUPLICATE_IN_PROMPT
from ..check_extended import NearDuplicateSettings
from .checks import RecordView
from .verdicts import PASS, Verdict

# Scripts written without spaces between words: each character is a token (Unicode blocks; Hangul is written
# with spaces and stays in words)
NO_SPACE_RANGES = (
    "\u0e00-\u0e7f"  # Thai
    "\u0e80-\u0eff"  # Lao
    "\u0f00-\u0fff"  # Tibetan
    "\u1000-\u109f"  # Myanmar
    "\u1780-\u17ff\u19e0-\u19ff"  # Khmer
    "\u2e80-\u2fdf"  # CJK radicals
    "\u3040-\u309f\u30a0-\u30ff\u31f0-\u31ff\uff66-\uff9f"  # Hiragana, Katakana (and half-width)
    "\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff"  # Han
    "\U00020000-\U0003134f"  # Han, supplementary planes
)
_TOKENS = {
    "auto": re.compile(f"[{NO_SPACE_RANGES}]|[^\\W{NO_SPACE_RANGES}]+"),
    "words": re.compile(r"\w+"),
    "chars": re.compile(r"\w"),
}
WITHIN_MAX_PROMPTS = 10_000  # prompts whose samples' signatures near_duplicate_in_prompt keeps (the latest ones)


def tokens(text: str, shingling: str = "auto") -> list[str]:
    return _TOKENS[shingling].findall(text.casefold())


def shingles(text: str, k: int = 3, shingling: str = "auto") -> set[bytes]:
    """The text's shingles: k consecutive tokens (a text of fewer tokens is one shingle; none: the empty set)."""
    toks = tokens(text, shingling)
    sep = "" if shingling == "chars" else " "
    if len(toks) < k:
        return {sep.join(toks).encode("utf-8", "surrogatepass")} if toks else set()
    return {sep.join(toks[i:i + k]).encode("utf-8", "surrogatepass") for i in range(len(toks) - k + 1)}


def jaccard(a: str, b: str, s: NearDuplicateSettings) -> float:
    """The exact Jaccard similarity of two texts' shingles under the settings (1.0 for two texts without any)."""
    x, y = shingles(a, s.shingle_size, s.shingling), shingles(b, s.shingle_size, s.shingling)
    return 1.0 if not x and not y else len(x & y) / len(x | y)


def text_of(record: RecordView, field: str) -> str:
    if field == "content":
        return record.content
    if field == "reasoning":
        return record.reasoning
    return record.reasoning + "\n" + record.content


class Signer:
    """MinHash signatures of texts under a run's near-duplicate settings."""

    def __init__(self, s: NearDuplicateSettings) -> None:
        from datasketch import MinHash  # noqa: PLC0415 - loaded only when the check is on

        self.s = s
        self._minhash = MinHash
        self.scheme = MinHash(num_perm=s.num_perm).scheme  # datasketch's hashing scheme (part of an index's key)

    def signature(self, text: str) -> Any:
        m = self._minhash(num_perm=self.s.num_perm)
        m.update_batch(list(shingles(text, self.s.shingle_size, self.s.shingling)))
        return m


class NearDuplicates:
    """The run's index: check() answers the verdicts of the scoped checks this run has, by name, and adds the
    answer (up to max_records). ``against``: (row, hashvalues) of an existing dataset (dedup_index.load)."""

    def __init__(self, s: NearDuplicateSettings, against: Any = None, against_name: str = "") -> None:
        from datasketch import LeanMinHash, MinHashLSH  # noqa: PLC0415 - loaded only when the check is on

        self.s = s
        self.signer = Signer(s)
        self.lsh = MinHashLSH(threshold=s.threshold, num_perm=s.num_perm)
        self.prompt_of: dict[int, int] = {}  # record id -> prompt (external rows are keyed by -(row))
        self.within: OrderedDict[int, list[tuple[int, Any]]] = OrderedDict()
        self.size = 0
        self.against_name = against_name
        if against is not None:
            rows, values = against
            with self.lsh.insertion_session() as session:
                for row, hv in zip(rows, values, strict=True):
                    session.insert(-int(row), LeanMinHash(seed=1, hashvalues=hv, scheme=self.signer.scheme))
            self.size = len(rows)

    def signature(self, text: str) -> Any:
        return self.signer.signature(text)

    def check(self, record: RecordView) -> dict[str, Verdict]:
        """{check name: verdict} for near_duplicate (across prompts) and near_duplicate_in_prompt, as configured."""
        text = text_of(record, self.s.field)
        names = ([NEAR_DUPLICATE] if self.s.enabled else []) + ([NEAR_DUPLICATE_IN_PROMPT] if self.s.within_prompt else [])
        if len(text.strip()) < self.s.min_chars:
            return dict.fromkeys(names, PASS)
        m = self.signature(text)
        prompt = record.idx if record.prompt_idx is None else record.prompt_idx
        out: dict[str, Verdict] = {}
        if self.s.enabled:
            out[NEAR_DUPLICATE] = self._across(record.record_id, prompt, m)
        if self.s.within_prompt:
            out[NEAR_DUPLICATE_IN_PROMPT] = self._within(record.record_id, prompt, m)
        return out

    def _across(self, key: int, prompt: int, m: Any) -> Verdict:
        others = [k for k in self.lsh.query(m) if k != key and self.prompt_of.get(k) != prompt]
        if not others:
            self.add(key, prompt, m)
            return PASS
        external = [k for k in others if k < 0]
        est = f"(MinHash LSH, Jaccard >= {self.s.threshold:g} estimated)"
        if external:
            return Verdict("fail", None, "dataset", f"near-duplicate of row {-max(external)} of "
                                                    f"{self.against_name or 'the --dedup-against dataset'} {est}")
        first = min(others)
        return Verdict("fail", None, None, f"near-duplicate of record {first} (prompt {self.prompt_of[first]}) {est}")

    def _within(self, key: int, prompt: int, m: Any) -> Verdict:
        earlier = self.within.setdefault(prompt, [])
        self.within.move_to_end(prompt)
        while len(self.within) > WITHIN_MAX_PROMPTS:
            self.within.popitem(last=False)
        best: tuple[float, int] | None = None
        for other, sig in earlier:
            if other != key:
                sim = float(m.jaccard(sig))
                if sim >= self.s.threshold and (best is None or sim > best[0]):
                    best = (sim, other)
        if all(other != key for other, _ in earlier):
            earlier.append((key, m))
        if best is None:
            return PASS
        return Verdict("fail", round(best[0], 3), None, f"near-duplicate of record {best[1]}, an earlier sample of "
                                                        f"the same prompt (MinHash Jaccard {best[0]:.2f} estimated)")

    def add(self, key: int, prompt: int, m: Any) -> None:
        if self.size < self.s.max_records and key not in self.lsh:
            self.lsh.insert(key, m)
            self.prompt_of[key] = prompt
            self.size += 1
