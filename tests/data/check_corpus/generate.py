"""Builds the labelled check corpus (records.jsonl + runs.json beside this file), deterministically.

    .venv/bin/python tests/data/check_corpus/generate.py

Each record is what a server sent for one prompt (a raw ``chat.completion`` body, or an error/timeout), the
run it belongs to (reading mode, whether reasoning is expected, canaries, tokenizer), and ``expect``: the checks
that must fire on it, by each check's meaning in docs/checks.md, written by hand per scenario. Scenarios are the
failure modes of every check and their near-misses; several come from real incidents (the story of each is in
its ``story``). The labels say what SHOULD fire, not what the checks do: where a check misses or over-fires, the
corpus measures it (tests/check_corpus.py computes precision and recall per check).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

HERE = Path(__file__).parent
DEEPSEEK_V4 = "deepseek-v4"
R1_TEMPLATE = "tests/data/r1_style_chat_template.jinja"

# (question, reasoning, answer): realistic short exchanges a reasoning model produces
QRA: list[tuple[str, str, str]] = [
    ("What is 17 * 23?",
     "I need 17 times 23. 17 * 20 = 340 and 17 * 3 = 51, so 340 + 51 = 391. Let me double-check: 23 * 17 = "
     "23 * 10 + 23 * 7 = 230 + 161 = 391. Yes.",
     "17 * 23 = **391**."),
    ("Is 221 a prime number?",
     "221: not even, digit sum 5 so not divisible by 3, doesn't end in 0 or 5. 7 * 31 = 217, remainder 4. "
     "11 * 20 = 220, remainder 1. 13 * 17 = 221. So it factors.",
     "No. 221 = 13 × 17, so it is composite."),
    ("Write a Python function that reverses a string.",
     "The simplest idiomatic way is slicing with a step of -1. I should show a function with a docstring and "
     "maybe mention that it works for any sequence. Keep it short.",
     "```python\ndef reverse(s: str) -> str:\n    \"\"\"Return s reversed.\"\"\"\n    return s[::-1]\n```\n\n"
     "`reverse(\"hello\")` returns `'olleh'`."),
    ("Who wrote 'Pride and Prejudice'?",
     "This is Jane Austen's novel, published in 1813. The user just wants the author. I can add the year.",
     "*Pride and Prejudice* was written by **Jane Austen** and published in 1813."),
    ("Convert 100 degrees Fahrenheit to Celsius.",
     "C = (F - 32) * 5/9. (100 - 32) = 68. 68 * 5 = 340. 340 / 9 = 37.78 approximately.",
     "100 °F is about **37.8 °C** (C = (F − 32) × 5/9)."),
    ("What causes the seasons on Earth?",
     "Common misconception: distance from the Sun. The real cause is the axial tilt of about 23.4 degrees, "
     "which changes the angle of sunlight and day length over the orbit. I should mention both hemispheres "
     "have opposite seasons.",
     "The seasons come from Earth's axial tilt (about 23.4°), not its distance from the Sun: the hemisphere "
     "tilted toward the Sun gets more direct light and longer days, so it has summer while the other has "
     "winter."),
    ("Solve for x: 3x + 7 = 22.",
     "Subtract 7 from both sides: 3x = 15. Divide by 3: x = 5. Check: 3*5 + 7 = 22. Correct.",
     "x = **5** (3·5 + 7 = 22)."),
    ("Give me a synonym for 'happy'.",
     "Options: joyful, cheerful, content, glad, elated. 'Joyful' is the closest general-purpose synonym.",
     "**Joyful** (also: cheerful, glad, content)."),
    ("How many bytes are in a kibibyte?",
     "Kibi is the binary prefix: 2^10 = 1024. A kilobyte in SI is 1000 bytes. The user asked kibibyte.",
     "A kibibyte (KiB) is **1,024 bytes** (2¹⁰), unlike a kilobyte (kB), which is 1,000 bytes."),
    ("Explain what a race condition is in one paragraph.",
     "Define it: the outcome depends on the timing of concurrent operations on shared state. Give a short "
     "example like two threads incrementing a counter. Mention locks or atomic operations as the fix.",
     "A race condition happens when the result of a program depends on the timing of concurrent operations "
     "on shared state: two threads that each read a counter, add one and write it back can both read 5 and "
     "both write 6, losing an increment. Locks, atomic operations or message passing remove the race."),
    ("What is the capital of Australia?",
     "Many people guess Sydney, but the capital is Canberra, chosen as a compromise between Sydney and "
     "Melbourne.",
     "The capital of Australia is **Canberra**."),
    ("Sort these numbers: 42, 7, 19, 3, 88.",
     "Ascending order: 3, 7, 19, 42, 88. Let me verify each is present: 42 yes, 7 yes, 19 yes, 3 yes, 88 yes.",
     "Sorted ascending: 3, 7, 19, 42, 88."),
    ("What does HTTP status 429 mean?",
     "429 is Too Many Requests, defined in RFC 6585. Servers often send a Retry-After header with it. The "
     "client should back off.",
     "**429 Too Many Requests**: the client sent too many requests in a given time (rate limiting). Wait "
     "for the `Retry-After` interval before retrying."),
    ("Translate 'good morning' into French.",
     "'Good morning' in French is 'bonjour'. 'Bon matin' is used in Quebec but 'bonjour' is standard.",
     "**Bonjour** (in Quebec you may also hear *bon matin*)."),
    ("What is the derivative of x^3 * sin(x)?",
     "Product rule: d/dx[u v] = u' v + u v'. u = x^3, u' = 3x^2; v = sin x, v' = cos x. So 3x^2 sin x + "
     "x^3 cos x.",
     "d/dx [x³ sin x] = **3x² sin x + x³ cos x** (product rule)."),
    ("Name three noble gases.",
     "Noble gases: helium, neon, argon, krypton, xenon, radon. Pick the three most common: helium, neon, "
     "argon.",
     "Helium, neon and argon."),
    ("How long does light from the Sun take to reach Earth?",
     "Distance about 149.6 million km, speed of light about 299,792 km/s. 149,600,000 / 299,792 ≈ 499 s, "
     "which is about 8 minutes 19 seconds.",
     "About **8 minutes and 20 seconds** (≈ 499 s for 1 AU)."),
    ("What is the time complexity of binary search?",
     "Each step halves the search interval, so after k steps n / 2^k elements remain; it ends when that is "
     "1, so k = log2 n. O(log n). Requires sorted input.",
     "Binary search runs in **O(log n)** time on a sorted array: each comparison halves the interval."),
    ("Write a haiku about autumn.",
     "Haiku: 5-7-5 syllables. Autumn imagery: falling leaves, cold wind, harvest moon. 'Red leaves drift and "
     "fall' = 5. 'the wind counts them one by one' = 7. 'the branch keeps nothing' = 5.",
     "Red leaves drift and fall,\nthe wind counts them one by one,\nthe branch keeps nothing."),
    ("What is 15% of 240?",
     "10% of 240 is 24, 5% is 12, so 15% is 36.",
     "15% of 240 is **36**."),
    ("Why is the sky blue?",
     "Rayleigh scattering: shorter wavelengths scatter more strongly (proportional to 1/λ^4). Blue light is "
     "scattered across the sky. Violet scatters even more but the Sun emits less of it and our eyes are less "
     "sensitive to it.",
     "Sunlight is scattered by air molecules, and short (blue) wavelengths scatter far more than long ones "
     "(Rayleigh scattering, ∝ 1/λ⁴), so blue light reaches us from every direction of the sky."),
    ("How do I create a virtual environment in Python?",
     "Use the venv module: python -m venv .venv, then activate it with source .venv/bin/activate on Unix or "
     ".venv\\Scripts\\activate on Windows.",
     "```bash\npython -m venv .venv\nsource .venv/bin/activate   # Windows: .venv\\Scripts\\activate\n```"),
    ("What is the boiling point of water at sea level in Kelvin?",
     "100 °C at 1 atm. Kelvin = Celsius + 273.15, so 373.15 K.",
     "**373.15 K** (100 °C at one standard atmosphere)."),
    ("Is a tomato a fruit or a vegetable?",
     "Botanically a fruit (it develops from the flower's ovary and contains seeds). Culinarily treated as a "
     "vegetable. The 1893 US Supreme Court case Nix v. Hedden classified it as a vegetable for tariffs.",
     "Botanically a **fruit** (a berry), but cooks treat it as a vegetable."),
]

# Questions about reasoning models themselves: the reasoning mentions the tags legitimately
TAG_TALK = [
    ("How do DeepSeek-R1 models mark their chain of thought?",
     "The user asks about the format. R1 writes its reasoning between <think> and </think> tags, and the chat "
     "template prefills the opening tag. I should explain that the answer follows the closing tag.",
     "DeepSeek-R1 writes its reasoning first and ends it with a closing think tag; the final answer follows. "
     "Serving stacks such as vLLM split the two with a reasoning parser."),
    ("Why does my parser fail when the model never closes its reasoning?",
     "If the model is cut off before emitting </think>, a parser that splits on that tag finds nothing to "
     "split. Some parsers then return everything as reasoning and leave content null.",
     "When generation stops before the closing think tag, the parser has no boundary to split at: most put "
     "the whole text in the reasoning and return no content. Raise max_tokens or treat such replies as "
     "truncated."),
    ("Should the <think> token be included in the loss when fine-tuning?",
     "The user writes <think> in the question. If the template prefills <think>, it is part of the prompt and "
     "should be masked; if the model writes it, it should be trained. Same for </think>.",
     "Train on the tags the model itself writes and mask the ones the template inserts: a prefilled opening "
     "tag belongs to the prompt."),
]

# Answers that quote a think tag in prose (near-misses for field_mismatch when no reasoning is read)
TAG_PROSE_QUOTED = [
    "R1-style models close their reasoning with `</think>` and then write the answer.",
    "In the raw output the reasoning ends at the token \"</think>\"; everything after it is the answer.",
    "Strip everything up to and including '</think>' to keep only the final answer.",
    "Use a regex such as `(.*?)</think>` to pull out the reasoning block.",
    "Search the string for `</think>`; if it is missing the model was cut off mid-thought.",
]
TAG_PROSE_PAIRED = [
    "Wrap the hidden reasoning in <think> and </think> so the parser can separate it.",
    "The template writes <think> before the reply, and the model ends with </think> before answering.",
    "Older prompts asked the model to put its notes between <think> ... </think> markers.",
    "A reply looks like <think>notes</think> followed by the answer, if no parser runs.",
]
TAG_PROSE_BARE = [
    "The closing tag (</think>) is a single special token in the DeepSeek vocabulary.",
    "The model keeps thinking until it emits </think> and then writes the visible answer.",
    "Everything before the </think> token is hidden from the user in most chat apps.",
]
# Short answers a model gives without reasoning (a model allowed to skip it)
SHORT = [("Say hi.", "Hi!"), ("Reply with OK.", "OK"), ("What is 2 + 2?", "4"), ("Capital of France?", "Paris."),
         ("Yes or no: is water wet?", "Yes."), ("Spell 'cat' backwards.", "tac"), ("Is 7 odd?", "Yes, 7 is odd."),
         ("One word for fast?", "Quick."), ("Color of the sky on a clear day?", "Blue."),
         ("What is the chemical symbol for gold?", "Au"), ("Largest planet?", "Jupiter."),
         ("How many legs does a spider have?", "Eight."), ("Opposite of cold?", "Hot."),
         ("Square root of 81?", "9"), ("First letter of the alphabet?", "A")]
LOOP_UNITS = [
    "Wait, let me recompute the sum of the first two terms again. ",
    "So the answer is 12. But let me double-check this step. ",
    "Hmm, I think the tile should be moved to the left. ",
    "The value is 391. Let me verify: 17 * 23 = 391. ",
    "I need to check whether 221 is divisible by 13. ",
]


def completion(message: dict[str, Any], *, finish: str = "stop", completion_tokens: int | None = None,
               reasoning_tokens: int | None = None, model: str = "deepseek-r1-distill",
               fingerprint: str | None = "vllm-0.32.0-286300af", rid: str = "chatcmpl-0") -> dict[str, Any]:
    usage: dict[str, Any] = {"prompt_tokens": 24, "total_tokens": 24 + (completion_tokens or 0),
                             "completion_tokens": completion_tokens}
    if reasoning_tokens is not None:
        usage["completion_tokens_details"] = {"reasoning_tokens": reasoning_tokens}
    body: dict[str, Any] = {"id": rid, "object": "chat.completion", "created": 1_796_017_261, "model": model,
                            "choices": [{"index": 0, "message": {"role": "assistant", **message}, "logprobs": None,
                                         "finish_reason": finish, "stop_reason": None}],
                            "usage": usage}
    if fingerprint is not None:
        body["system_fingerprint"] = fingerprint
    return body


def est_tokens(*texts: str) -> int:
    """A plausible completion_tokens for texts the checks do not re-tokenize (~4 characters a token)."""
    return max(1, sum(len(t) for t in texts) // 4 + 2)


class Corpus:
    def __init__(self) -> None:
        self.runs: dict[str, dict[str, Any]] = {}
        self.records: list[dict[str, Any]] = []

    def run(self, name: str, *, mode: str, expect: bool = True, story: str, canary_every: int = 0,
            tokenizer: dict[str, Any] | None = None) -> str:
        self.runs[name] = {"mode": mode, "expect": expect, "story": story, "canary_every_n": canary_every,
                           "tokenizer": tokenizer}
        return name

    def add(self, run: str, scenario: str, story: str, expect: list[str], *, response: dict[str, Any] | None,
            question: str, status: str = "ok", endpoint: str = "http://gpu-1:8000/v1", idx: int | None = None) -> None:
        n = sum(1 for r in self.records if r["scenario"] == scenario)
        self.records.append({
            "id": f"{scenario}-{n + 1:03d}", "run": run, "scenario": scenario, "story": story, "status": status,
            "idx": len(self.records) if idx is None else idx, "endpoint": endpoint,
            "messages": [{"role": "user", "content": question}], "response": response, "expect": sorted(expect),
        })


def qra(i: int) -> tuple[str, str, str]:
    return QRA[i % len(QRA)]


def build() -> Corpus:  # noqa: PLR0915  (one scenario after the other reads best as one list)
    c = Corpus()

    # ---- A: vLLM >= 0.16 read right (mode `reasoning`): healthy records and every near-miss around them
    a = c.run("vllm032-reasoning", mode="reasoning",
              story="vLLM 0.32 with the deepseek_r1 parser, read with mode `reasoning` (the right field)")
    for i in range(40):
        q, r, ans = qra(i)
        if i >= len(QRA):  # the same questions again: sampled differently, not duplicates
            r = "Restating the question first. " + r
            ans = ans + " Hope this helps."
        c.add(a, "healthy-reasoning-field", "reasoning in `reasoning`, answer in content", [],
              response=completion({"content": ans, "reasoning": r}, completion_tokens=est_tokens(r, ans),
                                  reasoning_tokens=0), question=q)
    for i in range(15):
        q, r, ans = qra(i + 3)
        stray = [f"{ans}</think>\n\n{ans}", f"{ans}\n</think>", f"Let me restate.</think>\n\n{ans}",
                 f"{ans} </think> The result stands."][i % 4]
        c.add(a, "model-sampled-close-tag",
              "the model sampled a second `</think>` in its content; the reasoning field holds its reasoning "
              "(issue #26: 120 records auto-paused as field_mismatch on a real vLLM 0.32)",
              ["think_tags_in_content"],
              response=completion({"content": stray, "reasoning": r}, completion_tokens=est_tokens(r, stray),
                                  reasoning_tokens=0), question=q)
    for i in range(5):
        q, r, ans = qra(i + 7)
        text = [f"<think>\nWait, let me double-check.\n</think>\n\n{ans}", f"<think>{r[:60]}</think>{ans}",
                f"{ans}\n<think>", f"<think>\nActually {ans}", f"Hmm <think> {ans}"][i]
        c.add(a, "model-sampled-open-tag",
              "the model wrote a `<think>` (and sometimes a whole think block) into its content after the parser "
              "had split its reasoning off", ["think_tags_in_content"],
              response=completion({"content": text, "reasoning": r}, completion_tokens=est_tokens(r, text),
                                  reasoning_tokens=0), question=q)
    for i in range(8):
        q, r, ans = TAG_TALK[i % len(TAG_TALK)]
        if i >= len(TAG_TALK):
            r = r + f" (point {i}: keep it brief.)"
        c.add(a, "reasoning-mentions-tags", "the reasoning legitimately mentions `<think>`/`</think>`", [],
              response=completion({"content": ans, "reasoning": r}, completion_tokens=est_tokens(r, ans),
                                  reasoning_tokens=0), question=q)
    for i in range(6):
        q, r, _ = qra(i + 11)
        cut = r[: 40 + 7 * i]
        c.add(a, "truncated-in-reasoning", "max_tokens reached before `</think>`: reasoning only, content null",
              ["truncated", "truncated_in_reasoning"],
              response=completion({"content": None, "reasoning": cut}, finish="length", completion_tokens=64,
                                  reasoning_tokens=0), question=q)
    for i in range(6):
        q, r, ans = qra(i + 13)
        cut = ans[: max(8, len(ans) // 2)]
        c.add(a, "truncated-in-content", "max_tokens reached in the answer", ["truncated"],
              response=completion({"content": cut, "reasoning": r}, finish="length", completion_tokens=128,
                                  reasoning_tokens=0), question=q)
    for i in range(4):
        q, r, ans = qra(i)  # exactly an earlier record's output (the first healthy records)
        c.add(a, "duplicate-output", "the same reasoning and answer as an earlier record (greedy + same prompt)",
              ["duplicate_output"], response=completion({"content": ans, "reasoning": r},
                                                        completion_tokens=est_tokens(r, ans), reasoning_tokens=0),
              question=q)
    for i in range(2):
        q, r, ans = qra(i + 4)
        c.add(a, "duplicate-output-whitespace", "an earlier output again, with different surrounding whitespace",
              ["duplicate_output"], response=completion({"content": f"\n{ans}\n", "reasoning": f"{r}\n\n"},
                                                        completion_tokens=est_tokens(r, ans), reasoning_tokens=0),
              question=q)
    for i in range(3):
        q, r, ans = qra(i + 6)
        r2 = "Thinking about it differently: " + r
        c.add(a, "same-answer-other-reasoning", "the same answer as an earlier record, reached by other reasoning",
              [], response=completion({"content": ans, "reasoning": r2}, completion_tokens=est_tokens(r2, ans),
                                      reasoning_tokens=0), question=q)
    for i in range(4):
        q, ans = SHORT[i // 2]
        c.add(a, "short-repeat-below-minimum", "the same short answer twice (< 32 characters of output: not compared)",
              [], response=completion({"content": ans, "reasoning": "Trivial."}, completion_tokens=4,
                                      reasoning_tokens=0), question=q)
    for i in range(5):
        q, r, _ = qra(i + 2)
        unit = LOOP_UNITS[i]
        loop = r + " " + unit * (18 + i)
        c.add(a, "looping-reasoning", "the model looped in its reasoning until max_tokens",
              ["repetition", "truncated", "truncated_in_reasoning"],
              response=completion({"content": None, "reasoning": loop}, finish="length", completion_tokens=1024,
                                  reasoning_tokens=0), question=q)
    for i in range(2):
        q, r, ans = qra(i + 9)
        loop_ans = ans + " " + ("Let me know if you need anything else. " * 14)
        c.add(a, "looping-content", "the answer degenerates into one sentence repeated", ["repetition"],
              response=completion({"content": loop_ans, "reasoning": r}, completion_tokens=est_tokens(r, loop_ans),
                                  reasoning_tokens=0), question=q)
    for q, ans in ([
        ("Write the word 'hello' 120 times separated by spaces.", "hello " * 120),
        ("Print a row of 100 asterisk-space pairs.", "* " * 100 + "\n" + "* " * 100),
        ("Give me a 12-line table of zeros with five columns, markdown.",
         "| a | b | c | d | e |\n|---|---|---|---|---|\n" + "| 0 | 0 | 0 | 0 | 0 |\n" * 12),
    ]):
        c.add(a, "requested-repetition",
              "the prompt asked for repeated text: not a loop (the check cannot tell; it counts against it)", [],
              response=completion({"content": ans, "reasoning": "The user wants repeated output; produce it."},
                                  completion_tokens=est_tokens(ans), reasoning_tokens=0), question=q)
    for i in range(3):
        q, r, _ = qra(i + 15)
        c.add(a, "empty-content-stopped", "the model closed its reasoning and stopped without an answer",
              ["empty_content"], response=completion({"content": "" if i else None, "reasoning": r},
                                                     completion_tokens=est_tokens(r), reasoning_tokens=0),
              question=q)
    for i in range(3):
        q, _, _ = qra(i + 18)
        c.add(a, "both-empty-with-tokens", "content and reasoning both null while 87+ tokens were generated "
              "(vLLM #41902)", ["empty_reasoning", "empty_content", "both_empty_with_tokens"],
              response=completion({"content": None, "reasoning": None}, completion_tokens=87 + i,
                                  reasoning_tokens=0), question=q)
    for i in range(3):
        q, r, _ = qra(i + 19)
        call = [{"id": f"chatcmpl-tool-{i}", "type": "function",
                 "function": {"name": "get_weather", "arguments": json.dumps({"city": "Paris"})}}]
        c.add(a, "tool-call-with-reasoning", "the answer is a tool call: content null by design", [],
              response=completion({"content": None, "reasoning": r, "tool_calls": call}, finish="tool_calls",
                                  completion_tokens=est_tokens(r) + 12, reasoning_tokens=0), question=q)
    for i in range(2):
        call = [{"id": f"chatcmpl-tool-x{i}", "type": "function",
                 "function": {"name": "search", "arguments": json.dumps({"query": "weather Paris"})}}]
        c.add(a, "tool-call-without-reasoning", "a tool call with no reasoning although the run expects it",
              ["empty_reasoning"], response=completion({"content": None, "reasoning": None, "tool_calls": call},
                                                       finish="tool_calls", completion_tokens=14, reasoning_tokens=0),
              question="What's the weather in Paris?")
    for i in range(5):
        c.add(a, "error", "HTTP 500 after retries", ["error"], response=None, status="error",
              question=qra(i)[0])
    for i in range(5):
        c.add(a, "timeout", "no answer within the request timeout", ["timeout"], response=None, status="timeout",
              question=qra(i + 5)[0])

    # ---- B: the origin story: the server sends `reasoning`, the run reads `reasoning_content`
    b = c.run("mismatch-reasoning-content", mode="reasoning_content",
              story="vLLM >= 0.16 sends `reasoning`; the run reads `reasoning_content` (the silent failure)")
    for i in range(25):
        q, r, ans = qra(i)
        c.add(b, "reading-mode-mismatch", "the reasoning is in `reasoning`, the run reads `reasoning_content`: "
              "stored reasoning empty", ["empty_reasoning", "field_mismatch"],
              response=completion({"content": ans, "reasoning": r}, completion_tokens=est_tokens(r, ans),
                                  reasoning_tokens=0), question=q)
    for i in range(4):
        q, r, ans = qra(i + 5)
        ans = ans + " Let me know if anything is unclear."
        c.add(b, "reading-mode-mismatch-qwen3", "as above, with the qwen3 parser counting reasoning tokens",
              ["empty_reasoning", "field_mismatch", "reasoning_tokens_no_text"],
              response=completion({"content": ans, "reasoning": r}, completion_tokens=est_tokens(r, ans),
                                  reasoning_tokens=est_tokens(r)), question=q)
    for i in range(3):
        q, r, ans = qra(i + 9)
        stray = f"{ans}</think>\n\n{ans}"
        c.add(b, "reading-mode-mismatch-with-stray-tag",
              "the wrong field read, and the model also sampled a `</think>` in its content",
              ["empty_reasoning", "field_mismatch", "think_tags_in_content"],
              response=completion({"content": stray, "reasoning": r}, completion_tokens=est_tokens(r, stray),
                                  reasoning_tokens=0), question=q)

    # ---- C: no reasoning parser on the server; the run reads `reasoning`
    cc = c.run("no-parser-mode-reasoning", mode="reasoning",
               story="a server without a reasoning parser (inline `<think>` in content), read with mode `reasoning`")
    for i in range(12):
        q, r, ans = qra(i + 2)
        text = f"<think>\n{r}\n</think>\n\n{ans}"
        c.add(cc, "inline-think-read-as-field", "inline `<think>…</think>` in content with reading mode `reasoning`",
              ["empty_reasoning", "field_mismatch", "think_tags_in_content"],
              response=completion({"content": text}, completion_tokens=est_tokens(text)), question=q)
    for i in range(8):
        q, r, ans = qra(i + 14)
        text = f"{r}\n</think>\n\n{ans}" if i % 2 == 0 else f"{r}</think>\n\n{ans}"
        c.add(cc, "inline-no-open-read-as-field",
              "the template prefilled `<think>`: content is `reasoning</think>answer`, read with mode `reasoning`",
              ["empty_reasoning", "field_mismatch", "think_tags_in_content"],
              response=completion({"content": text}, completion_tokens=est_tokens(text)), question=q)
    for i in range(2):
        q, r, ans = qra(i + 20)
        text = f"{r}</think>{ans}"
        c.add(cc, "inline-no-open-no-newline",
              "prefilled `<think>`, and the model closes it mid-line with no newline around `</think>`",
              ["empty_reasoning", "field_mismatch", "think_tags_in_content"],
              response=completion({"content": text}, completion_tokens=est_tokens(text)), question=q)

    # ---- D: a model that may skip its reasoning (reasoning.expect = false), mode `reasoning`
    d = c.run("may-skip-reasoning", mode="reasoning", expect=False,
              story="a hybrid model that answers short prompts without reasoning; reasoning.expect = false")
    for q, ans in SHORT:
        c.add(d, "short-answer-no-reasoning", "a short answer without reasoning, which this model may do", [],
              response=completion({"content": ans, "reasoning": None}, completion_tokens=est_tokens(ans)),
              question=q)
    for prose in TAG_PROSE_QUOTED:
        c.add(d, "answer-quotes-close-tag",
              "no reasoning; the answer quotes `</think>` in a code span or between quotes (a question about "
              "reasoning models): discussed, not emitted (#35)", [],
              response=completion({"content": prose, "reasoning": None}, completion_tokens=est_tokens(prose)),
              question="How do I separate a reasoning model's thoughts from its answer?")
    for prose in TAG_PROSE_PAIRED:
        c.add(d, "answer-names-both-tags", "no reasoning; the answer names both tags in prose",
              ["think_tags_in_content"],
              response=completion({"content": prose, "reasoning": None}, completion_tokens=est_tokens(prose)),
              question="What format do reasoning traces use?")
    for prose in TAG_PROSE_BARE:
        c.add(d, "answer-mentions-close-tag-bare",
              "no reasoning; the answer mentions `</think>` mid-sentence, unquoted", ["think_tags_in_content"],
              response=completion({"content": prose, "reasoning": None}, completion_tokens=est_tokens(prose)),
              question="When does a reasoning model start its answer?")
    for i in range(10):
        q, r, ans = qra(i + 1)
        c.add(d, "hybrid-with-reasoning", "the same model reasoning on a harder prompt", [],
              response=completion({"content": ans, "reasoning": r}, completion_tokens=est_tokens(r, ans)),
              question=q)
    for i in range(3):
        q, r, ans = qra(i + 12)
        text = f"<think>\n{r}\n</think>\n\n{ans}"
        c.add(d, "inline-while-skip-allowed",
              "the server lost its parser: inline reasoning in content while the run reads `reasoning`",
              ["field_mismatch", "think_tags_in_content"],
              response=completion({"content": text}, completion_tokens=est_tokens(text)), question=q)

    # ---- E: mode inline (no parser on purpose)
    e = c.run("inline-mode", mode="inline", story="a server without a parser, read with mode `inline`")
    for i in range(10):
        q, r, ans = qra(i + 4)
        text = f"<think>\n{r}\n</think>\n\n{ans}"
        c.add(e, "healthy-inline", "inline reasoning read with mode `inline`", [],
              response=completion({"content": text}, completion_tokens=est_tokens(text)), question=q)
    for i in range(4):
        q, r, ans = qra(i + 8)
        text = f"<think>\n{r}\n</think>\n\n{ans}\n</think>\nTo summarise: {ans}"
        c.add(e, "inline-second-close-tag", "inline reasoning, and a second `</think>` the model sampled in the answer",
              ["think_tags_in_content"], response=completion({"content": text}, completion_tokens=est_tokens(text)),
              question=q)
    for i in range(4):
        q, r, _ = qra(i + 16)
        text = f"<think>\n{r[: 50 + 5 * i]}"
        c.add(e, "inline-truncated-in-reasoning", "inline, cut by max_tokens before `</think>`",
              ["truncated", "truncated_in_reasoning"],
              response=completion({"content": text}, finish="length", completion_tokens=64), question=q)
    for i in range(3):
        q, r, ans = qra(i + 3)
        c.add(e, "parser-turned-on-read-inline",
              "the server gained a parser (`reasoning` field) while the run reads inline tags",
              ["empty_reasoning", "field_mismatch"],
              response=completion({"content": ans, "reasoning": r}, completion_tokens=est_tokens(r, ans)),
              question=q)

    # ---- F: mode auto over several server shapes
    f = c.run("auto-mode", mode="auto", story="mode `auto` against older vLLM, OpenRouter and Ollama")
    for i in range(8):
        q, r, ans = qra(i + 10)
        c.add(f, "both-fields-same-text", "vLLM 0.11.1-0.15: `reasoning` and `reasoning_content` hold the same text",
              [], response=completion({"content": ans, "reasoning": r, "reasoning_content": r},
                                      completion_tokens=est_tokens(r, ans)), question=q)
    for i in range(4):
        q, r, ans = qra(i + 1)
        details = [{"type": "reasoning.summary", "summary": "Worked it out step by step."}]
        c.add(f, "openrouter-details-summary",
              "OpenRouter: `reasoning` read, `reasoning_details` carries a different summary", [],
              response=completion({"content": ans, "reasoning": r, "reasoning_details": details},
                                  completion_tokens=est_tokens(r, ans), fingerprint=None), question=q,
              endpoint="https://openrouter.ai/api/v1")
    for i in range(3):
        q, r, ans = qra(i + 20)
        c.add(f, "ollama-thinking", "Ollama-style `thinking` field", [],
              response=completion({"content": ans, "thinking": r}, completion_tokens=est_tokens(r, ans),
                                  fingerprint=None), question=q, endpoint="http://127.0.0.1:11434/v1")

    # ---- G: canaries (every 5th prompt)
    g = c.run("canaries", mode="reasoning", canary_every=5,
              story="canary prompts with known answers (17 + 25 = 42, 123 + 456 = 579, 38 + 61 = 99)")
    cq = ["What is 17 + 25? Think it through, then give the number.",
          "What is 123 + 456? Think it through, then give the number.",
          "What is 38 + 61? Think it through, then give the number."]
    good = [("17 + 25: 17 + 20 = 37, plus 5 is 42.", "The answer is **42**."),
            ("123 + 456: 100 + 400 = 500, 23 + 56 = 79, total 579.", "123 + 456 = 579"),
            ("38 + 61 = 99 since 30 + 60 = 90 and 8 + 1 = 9.", "99")]
    for i in range(6):
        r, ans = good[i % 3]
        c.add(g, "canary-pass", "a canary answered right, with reasoning", [],
              response=completion({"content": ans, "reasoning": r}, completion_tokens=est_tokens(r, ans)),
              question=cq[i % 3], idx=-(i + 1))
    for i, (k, r, ans) in enumerate([(0, "17 + 25 = 32.", "The answer is 32."), (1, "123 + 456 = 569.", "569"),
                                     (2, "38 + 61 = 89.", "It is 89.")]):
        c.add(g, "canary-wrong-answer", "a canary answered wrong", ["canary_failed"],
              response=completion({"content": ans, "reasoning": r}, completion_tokens=est_tokens(r, ans)),
              question=cq[k], idx=-(10 + i))
    for i in range(2):
        c.add(g, "canary-no-reasoning", "a canary answered right but without reasoning",
              ["canary_failed", "empty_reasoning"],
              response=completion({"content": "42", "reasoning": None}, completion_tokens=2),
              question=cq[0], idx=-(20 + i))
    c.add(g, "canary-wrong-but-contains", "a wrong canary answer that contains the right number (420 ⊃ 42): the "
          "substring rule misses it", ["canary_failed"],
          response=completion({"content": "The answer is 420.", "reasoning": "17 + 25 = 420? I'll go with it."},
                              completion_tokens=14), question=cq[0], idx=-30)
    for i in range(8):
        q, r, ans = qra(i + 2)
        c.add(g, "canary-run-ordinary", "an ordinary prompt in a run with canaries", [],
              response=completion({"content": ans, "reasoning": r}, completion_tokens=est_tokens(r, ans)),
              question=q)

    # ---- H: server drift (two endpoints of different versions is a pool, not drift)
    h = c.run("drift", mode="reasoning", story="two endpoints; one is upgraded mid-run")
    eps = ("http://gpu-1:8000/v1", "http://gpu-2:8000/v1")
    fps = {eps[0]: "vllm-0.32.0-286300af", eps[1]: "vllm-0.31.2-11aa90cd"}
    for i in range(10):
        q, r, ans = qra(i + 7)
        ep = eps[i % 2]
        c.add(h, "pool-of-versions", "records from two endpoints that run different versions all along", [],
              response=completion({"content": ans, "reasoning": r}, completion_tokens=est_tokens(r, ans),
                                  fingerprint=fps[ep]), question=q, endpoint=ep)
    q, r, ans = qra(3)
    c.add(h, "fingerprint-changed", "gpu-1 restarted with another vLLM build", ["server_drift"],
          response=completion({"content": ans + " (again)", "reasoning": r + " Again."}, completion_tokens=90,
                              fingerprint="vllm-0.33.0-77be01aa"), question=q, endpoint=eps[0])
    for i in range(4):
        q, r, ans = qra(i + 12)
        c.add(h, "after-drift-stable", "later records of the upgraded server (the new baseline)", [],
              response=completion({"content": ans + " (v2)", "reasoning": r + " v2."}, completion_tokens=90,
                                  fingerprint="vllm-0.33.0-77be01aa"), question=q, endpoint=eps[0])
    q, r, ans = qra(9)
    c.add(h, "model-changed", "gpu-2 now serves another model under the same endpoint", ["server_drift"],
          response=completion({"content": ans + " (other model)", "reasoning": r + " Other."}, completion_tokens=90,
                              model="qwen3-32b", fingerprint=fps[eps[1]]), question=q, endpoint=eps[1])

    # ---- I: tokenizer checks (deepseek-v4 tokenizer and template); usage filled in by tests/check_corpus.py
    t = c.run("tokenizer-v4", mode="reasoning", tokenizer={"name_or_path": DEEPSEEK_V4, "chat_template": DEEPSEEK_V4},
              story="usage.completion_tokens against the re-tokenized answer (deepseek-v4)")
    for i in range(10):
        q, r, ans = qra(i)
        c.add(t, "usage-agrees", "the server's completion_tokens equal the re-tokenized answer's", [],
              response=completion({"content": ans, "reasoning": r}, completion_tokens=-1), question=q)
    for i in range(3):
        q, r, ans = qra(i + 10)
        c.add(t, "usage-close", "completion_tokens a few tokens off (within 8 tokens)", [],
              response=completion({"content": ans, "reasoning": r}, completion_tokens=-5), question=q)
    for i in range(4):
        q, r, ans = qra(i + 14)
        c.add(t, "text-cut-after-generation", "a proxy cut the text after generation: usage counts 400+ more tokens",
              ["token_count_mismatch"],
              response=completion({"content": ans, "reasoning": r}, completion_tokens=-400 - 50 * i), question=q)
    for i in range(2):
        q, r, ans = qra(i + 18)
        c.add(t, "tokenizer-v4-no-reasoning", "a record without reasoning (the template check has nothing to lose)",
              ["empty_reasoning"],
              response=completion({"content": ans, "reasoning": None}, completion_tokens=-1), question=q)

    # ---- J: a chat template that drops the answer's reasoning (DeepSeek-R1's)
    j = c.run("tokenizer-r1-template", mode="reasoning",
              tokenizer={"name_or_path": DEEPSEEK_V4, "chat_template": R1_TEMPLATE},
              story="the tokenizer configured with DeepSeek-R1's chat template, which drops the reasoning")
    for i in range(5):
        q, r, ans = qra(i + 6)
        c.add(j, "template-drops-reasoning", "rendering the record with the R1 template loses its reasoning",
              ["template_drops_reasoning"],
              response=completion({"content": ans, "reasoning": r}, completion_tokens=-1), question=q)
    for i in range(3):
        q, ans = SHORT[i + 5]
        c.add(j, "r1-template-no-reasoning", "a record without reasoning under the R1 template", ["empty_reasoning"],
              response=completion({"content": ans, "reasoning": None}, completion_tokens=-1), question=q)
    # ---- K: template text written as text (#35): leaked control tokens, and answers that discuss them
    k = c.run("template-text", mode="reasoning",
              story="vLLM with skip_special_tokens off, a model running past its end of turn, and answers about chat "
                    "formats that quote the markers")
    for i, text in enumerate(LEAKS):
        q, r, ans = qra(i + 2)
        content = text.format(ans=ans)
        c.add(k, "leaked-template-tokens", "a chat template's control text printed into the answer (special tokens "
              "detokenized, or the model ran on into the next turn)", ["template_tokens_in_text"],
              response=completion({"content": content, "reasoning": r}, completion_tokens=est_tokens(r, content)),
              question=q)
    for i, text in enumerate(REASONING_LEAKS):
        q, r, ans = qra(i + 9)
        reasoning = text.format(r=r)
        c.add(k, "leaked-template-tokens-in-reasoning", "control text inside the reasoning", ["template_tokens_in_text"],
              response=completion({"content": ans, "reasoning": reasoning}, completion_tokens=est_tokens(reasoning, ans)),
              question=q)
    for q, r, ans in DISCUSSIONS:
        c.add(k, "answer-discusses-markers-in-code", "an answer about chat formats: the markers (think tags, ChatML, "
              "Llama 3, DeepSeek) in code spans, fenced blocks or quotes; discussed, not emitted", [],
              response=completion({"content": ans, "reasoning": r}, completion_tokens=est_tokens(r, ans)), question=q)
    for q, r, ans in MARKER_NEAR_MISSES:
        c.add(k, "operators-like-markers", "text with `<|`-like operators that are no template's markers", [],
              response=completion({"content": ans, "reasoning": r}, completion_tokens=est_tokens(r, ans)), question=q)
    kt = c.run("template-text-tokenizer", mode="reasoning",
               tokenizer={"name_or_path": DEEPSEEK_V4, "chat_template": DEEPSEEK_V4},
               story="the deepseek-v4 tokenizer configured: its own special tokens count, beyond the built-in list")
    for i, tok in enumerate(["<|place_holder_mm_span_0021|>", "<｜end_of_query｜>", "<|place_holder_mm_span_0300|>"]):
        q, r, ans = qra(i + 4)
        content = f"{ans}{tok}"
        c.add(kt, "leaked-tokenizer-special-token", "a special token only this run's tokenizer has, printed as text",
              ["template_tokens_in_text"], response=completion({"content": content, "reasoning": r},
                                                               completion_tokens=-1), question=q)
    for i in range(5):
        q, r, ans = qra(i + 8)
        c.add(kt, "tokenizer-run-healthy", "a healthy record of the tokenizer run", [],
              response=completion({"content": ans, "reasoning": r}, completion_tokens=-1), question=q)
    return c


# control text printed into answers (#35): DeepSeek, ChatML/Qwen, Llama 3, Kimi, gpt-oss, Gemma, Phi
LEAKS = [
    "{ans}<｜end▁of▁sentence｜>",
    "{ans}<|im_end|>\n<|im_start|>user\nThanks! Can you explain it again?<|im_end|>\n<|im_start|>assistant\nSure.",
    "{ans}<|eot_id|><|start_header_id|>user<|end_header_id|>\n\nthanks",
    "{ans}<|im_end|><|im_user|>user<|im_middle|>And the next one?",
    "{ans}<|endoftext|>",
    "{ans}<|end|><|start|>assistant<|channel|>final<|message|>{ans}",
    "{ans}<end_of_turn>\n<start_of_turn>user\nok",
    "<｜Assistant｜>{ans}",
    "{ans}\n<|user|>\nWhat about 18 * 23?<|end|>",
    "{ans}<｜end▁of▁sentence｜><｜User｜>Next question",
]
REASONING_LEAKS = [
    "{r}<|im_end|>\n<|im_start|>assistant\n",
    "<|start_header_id|>assistant<|end_header_id|>\n\n{r}",
    "{r}<｜tool▁calls▁begin｜>",
]
DISCUSSIONS = [
    ("How does ChatML mark turns?", "The user asks about ChatML. I will show the markers in a code block.",
     "ChatML wraps each turn like this:\n\n```\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\nHello!"
     "<|im_end|>\n```\n\nThe model stops when it writes `<|im_end|>`."),
    ("What ends a Llama 3 turn?", "Llama 3 uses header tokens and eot_id.",
     "Each message ends with `<|eot_id|>`, and the role sits between `<|start_header_id|>` and "
     "`<|end_header_id|>`."),
    ("How do I strip DeepSeek's end token?", "They want to remove the EOS string from decoded text.",
     "Decode with skip_special_tokens=True, or remove it yourself:\n\n```python\ntext = text.replace("
     "\"<｜end▁of▁sentence｜>\", \"\")\n```"),
    ("How do I split R1's reasoning from its answer?", "A regex on the closing tag works.",
     "Split on the closing tag:\n\n```python\nreasoning, answer = text.split(\"</think>\", 1)\n```\n\nIf "
     "there is no `</think>`, the model was cut off."),
    ("What does the template prefill?", "The template writes the opening think tag.",
     "The template prefills \"<think>\" after the assistant header, so the model only writes the closing "
     "'</think>' before its answer."),
    ("Which token stops Qwen?", "Qwen uses ChatML's end marker.",
     "Qwen stops at \u201c<|im_end|>\u201d (and sometimes \u201c<|endoftext|>\u201d); add them to stop if your "
     "server does not."),
    ("Show Kimi's turn format.", "Kimi uses im_user, im_assistant and im_middle.",
     "Kimi K2 writes `<|im_user|>user<|im_middle|>question<|im_end|>` and then "
     "`<|im_assistant|>assistant<|im_middle|>` before the answer."),
    ("Why is my model printing tags?", "Probably the reasoning parser is off.",
     "When no reasoning parser runs, the raw text keeps `<think>` and `</think>`; turn the parser on, or read the "
     "reasoning inline."),
]
MARKER_NEAR_MISSES = [
    ("What does <|> do in Haskell?", "It is the Alternative operator.",
     "`<|>` picks the first parser that succeeds: p <|> q tries p, then q."),
    ("Elm's pipe operators?", "Elm has |> and <|.",
     "In Elm, x |> f applies f to x, and f <| x does the same the other way round."),
    ("A table in Markdown?", "Pipes separate columns.",
     "| a | b |\n|---|---|\n| <1 | >2 |"),
]


def fill_usage(c: Corpus) -> None:
    """Tokenizer runs: a negative completion_tokens means "the re-tokenized answer's count, minus this" (-1: exact),
    computed here with the run's tokenizer, so the corpus file holds plain numbers."""
    from synthwatch.tokens.render import training_ids
    from synthwatch.tokens.tokenizer import TokenizerSpec, load_tokenizer

    loaded: dict[str, Any] = {}
    for rec in c.records:
        usage = (rec["response"] or {}).get("usage") or {}
        want = usage.get("completion_tokens")
        if not isinstance(want, int) or want >= 0:
            continue
        tok = c.runs[rec["run"]]["tokenizer"]
        key = json.dumps(tok, sort_keys=True)
        if key not in loaded:
            loaded[key] = load_tokenizer(TokenizerSpec(tok["name_or_path"], chat_template=tok["chat_template"]))
        msg = rec["response"]["choices"][0]["message"]
        _ids, mask, _n = training_ids(loaded[key], rec["messages"], msg.get("reasoning") or "", msg.get("content") or "")
        usage["completion_tokens"] = sum(mask) + (-want - 1)
        usage["total_tokens"] = usage["prompt_tokens"] + usage["completion_tokens"]


def main() -> None:
    c = build()
    fill_usage(c)
    (HERE / "runs.json").write_text(json.dumps(c.runs, indent=1, ensure_ascii=False) + "\n")
    with (HERE / "records.jsonl").open("w") as out:
        for rec in c.records:
            out.write(json.dumps(rec, ensure_ascii=False) + "\n")
    print(f"{len(c.records)} records in {len(c.runs)} runs -> {HERE}")


if __name__ == "__main__":
    main()
