"""synthwatch.tokens.tokenizer: offline tokenizer loading, record -> training tokens, integrity warnings."""

from __future__ import annotations

import json
import random
import time
from pathlib import Path

import pytest

from synthwatch.tokens.render import render_record, training_ids
from synthwatch.tokens.tokenizer import (
    DEEPSEEK_V4,
    LoadedTokenizer,
    TokenizerError,
    TokenizerSpec,
    classify_token,
    load_tokenizer,
)

THINK_OPEN, THINK_CLOSE = 128821, 128822
BOS, EOS = 0, 1
USER, ASSISTANT = 128803, 128804

MESSAGES = [
    {"role": "system", "content": "Answer briefly."},
    {"role": "user", "content": "What is 2 + 2? 你好"},
]
REASONING = "The user asks for 2 + 2. That is 4. Naïve check: 2 + 2 = 4 🤔."
CONTENT = "The answer is **4**."

# Renders past AND final assistant turns as an empty think block, as Kimi-K2-Thinking's template does for
# every turn outside the current tool-call loop.
DROPPING_TEMPLATE = (
    "<｜begin▁of▁sentence｜>{% for m in messages %}"
    "{% if m.role == 'user' %}<｜User｜>{{ m.content }}"
    "{% elif m.role == 'assistant' %}<｜Assistant｜><think></think>{{ m.content }}<｜end▁of▁sentence｜>"
    "{% endif %}{% endfor %}{% if add_generation_prompt %}<｜Assistant｜>{% endif %}"
)

TINY_TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}"
    "{% if m.role == 'user' %}<|user|>{{ m.content }}"
    "{% elif m.role == 'assistant' %}<|assistant|><think>{{ m.reasoning_content }}</think>{{ m.content }}</s>"
    "{% endif %}{% endfor %}{% if add_generation_prompt %}<|assistant|>{% endif %}"
)


@pytest.fixture(scope="module")
def lt() -> LoadedTokenizer:
    return load_tokenizer(TokenizerSpec(DEEPSEEK_V4))


@pytest.fixture(scope="module")
def tiny_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A byte-level BPE tokenizer where `<think>` is NOT an added token, saved with its own template."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    backend = Tokenizer(models.BPE())
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=300,
        special_tokens=["<s>", "</s>", "<|user|>", "<|assistant|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    backend.train_from_iterator(
        ["let me think about it", "the answer is four", "think hello world"] * 20, trainer
    )
    tok = PreTrainedTokenizerFast(tokenizer_object=backend, bos_token="<s>", eos_token="</s>")
    tok.chat_template = TINY_TEMPLATE
    folder = tmp_path_factory.mktemp("tiny_tokenizer")
    tok.save_pretrained(str(folder))
    return folder


def codes(rendered) -> list[str]:
    return [w.code for w in rendered.warnings]


# ------------------------------------------------------------------------------------------- loading


def test_load_deepseek_v4_by_name(lt: LoadedTokenizer) -> None:
    assert lt.think_open_id == THINK_OPEN
    assert lt.think_close_id == THINK_CLOSE
    info = lt.describe()
    assert info["name"] == DEEPSEEK_V4
    assert info["vocab_size"] == len(lt.tok) > 128_000
    assert info["template_source"] == "synthwatch:deepseek-v4"  # the package has no template: ours is used
    assert (info["think_open_id"], info["think_close_id"]) == (THINK_OPEN, THINK_CLOSE)
    assert load_tokenizer(TokenizerSpec(DEEPSEEK_V4)) is lt  # cached per spec


def test_explicit_template_choice_shares_the_tokenizer(lt: LoadedTokenizer) -> None:
    other = load_tokenizer(TokenizerSpec(DEEPSEEK_V4, chat_template=DEEPSEEK_V4))
    assert other.template_source == "synthwatch:deepseek-v4"
    assert other.tok is lt.tok


def test_classify_token(lt: LoadedTokenizer) -> None:
    assert classify_token(lt, THINK_OPEN) == "think"
    assert classify_token(lt, THINK_CLOSE) == "think"
    assert classify_token(lt, USER) == "role"
    assert classify_token(lt, ASSISTANT) == "role"
    assert classify_token(lt, 128805) == "role"  # <|EOT|>
    assert classify_token(lt, BOS) == "bos_eos"
    assert classify_token(lt, EOS) == "bos_eos"
    assert classify_token(lt, 2) == "special"  # <｜▁pad▁｜>, an added token flagged special
    assert classify_token(lt, 128800) == "added"  # <｜fim▁hole｜>
    assert classify_token(lt, lt.encode("hello")[0]) == "text"


def test_missing_hub_name_offline() -> None:
    with pytest.raises(TokenizerError) as err:
        load_tokenizer(TokenizerSpec("no-such-org/no-such-model-synthwatch"))
    message = str(err.value)
    assert "'no-such-org/no-such-model-synthwatch'" in message
    assert "offline" in message and "not in the HF cache" in message and "folder path" in message


def test_missing_folder(tmp_path: Path) -> None:
    with pytest.raises(TokenizerError, match="no such folder"):
        load_tokenizer(TokenizerSpec(str(tmp_path / "not" / "there")))


def test_folder_without_tokenizer_files(tmp_path: Path) -> None:
    (tmp_path / "README.md").write_text("nothing here")
    with pytest.raises(TokenizerError) as err:
        load_tokenizer(TokenizerSpec(str(tmp_path)))
    assert "has no tokenizer files" in str(err.value)
    assert "tokenizer.json" in str(err.value)


def test_remote_code_needs_trust(tmp_path: Path) -> None:
    config = {
        "tokenizer_class": "TikTokenTokenizer",
        "auto_map": {"AutoTokenizer": ["tokenization_kimi.X", None]},
    }
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(config))
    (tmp_path / "tiktoken.model").write_text("")
    (tmp_path / "tokenization_kimi.py").write_text("raise SystemExit('must not run')\n")
    with pytest.raises(TokenizerError) as err:
        load_tokenizer(TokenizerSpec(str(tmp_path)))
    assert "needs trust_remote_code=True (tokenization_kimi.py)" in str(err.value)
    assert "--trust-remote-code" in str(err.value)


def test_missing_template_file() -> None:
    with pytest.raises(TokenizerError, match="no such file"):
        load_tokenizer(TokenizerSpec(DEEPSEEK_V4, chat_template="/nonexistent/template.jinja"))


def test_no_template_at_all(tiny_folder: Path, tmp_path: Path) -> None:
    bare = tmp_path / "bare"
    bare.mkdir()
    (bare / "tokenizer.json").write_bytes((tiny_folder / "tokenizer.json").read_bytes())
    lt = load_tokenizer(TokenizerSpec(str(bare)))
    assert lt.template_source is None
    with pytest.raises(TokenizerError, match="has no chat template"):
        render_record(lt, MESSAGES, REASONING, CONTENT)


# ----------------------------------------------------------------------------------------- rendering


def test_render_chips_ids_and_mask(lt: LoadedTokenizer) -> None:
    r = render_record(lt, MESSAGES, REASONING, CONTENT, expected_think_ids=(THINK_OPEN, THINK_CLOSE))
    ids = r.input_ids
    assert r.warnings == []
    assert r.template_source == "synthwatch:deepseek-v4"
    assert len(r.chips) == len(ids) == len(r.loss_mask)
    assert [c.id for c in r.chips] == ids

    # think delimiters: once each, single chips of kind "think"; <think> is prefilled in the prompt
    assert ids.count(THINK_OPEN) == 1 and ids.count(THINK_CLOSE) == 1
    open_pos, close_pos = ids.index(THINK_OPEN), ids.index(THINK_CLOSE)
    assert r.chips[open_pos].kind == "think" and r.chips[open_pos].text == "<think>"
    assert r.chips[close_pos].kind == "think" and r.chips[close_pos].text == "</think>"
    assert open_pos == r.prompt_len - 1 and ids[open_pos - 1] == ASSISTANT

    # BOS, role markers, EOS
    assert ids[0] == BOS and r.chips[0].kind == "bos_eos"
    assert [c.id for c in r.chips if c.kind == "role"] == [USER, ASSISTANT]
    assert ids[-1] == EOS and r.chips[-1].kind == "bos_eos" and r.chips[-1].in_assistant
    assert {c.kind for c in r.chips} == {"bos_eos", "role", "think", "text"}

    # loss mask covers exactly the assistant span: everything after the prompt rendering
    prompt_text = lt.apply_chat_template(MESSAGES, add_generation_prompt=True)
    assert prompt_text.endswith("<｜Assistant｜><think>")
    assert r.text.startswith(prompt_text)
    assert r.loss_mask == [0] * r.prompt_len + [1] * (len(ids) - r.prompt_len)
    assert [c.in_assistant for c in r.chips] == [bool(m) for m in r.loss_mask]
    masked = [i for i, m in zip(ids, r.loss_mask, strict=True) if m]
    assert lt.decode(masked) == r.text[len(prompt_text) :]
    assert lt.decode(masked) == f"{REASONING}</think>{CONTENT}<｜end▁of▁sentence｜>"

    # chips reproduce the text byte for byte (the emoji is split over tokens that are not UTF-8 alone)
    assert bytes.fromhex(" ".join(c.raw_bytes for c in r.chips)).decode("utf-8") == r.text
    assert any("\\x" in c.text for c in r.chips)
    chinese = next(c for c in r.chips if "你" in c.text)
    assert chinese.raw_bytes.startswith("e4 bd a0") and chinese.piece != chinese.text

    assert r.totals == {
        "tokens": len(ids),
        "prompt": r.prompt_len,
        "assistant": len(ids) - r.prompt_len,
        "reasoning_tokens_est": len(lt.encode(REASONING)),
        "content_tokens_est": len(lt.encode(CONTENT)),
        "special": 6,  # BOS, <｜User｜>, <｜Assistant｜>, <think>, </think>, EOS
    }
    assert r.as_dict()["chips"][0]["kind"] == "bos_eos"


def test_training_ids_match_render(lt: LoadedTokenizer) -> None:
    r = render_record(lt, MESSAGES, REASONING, CONTENT)
    assert training_ids(lt, MESSAGES, REASONING, CONTENT) == (r.input_ids, r.loss_mask, r.prompt_len)


def test_sharegpt_turns_are_accepted(lt: LoadedTokenizer) -> None:
    sharegpt = [
        {"from": "system", "value": "Answer briefly."},
        {"from": "human", "value": "What is 2 + 2? 你好"},
    ]
    assert training_ids(lt, sharegpt, REASONING, CONTENT) == training_ids(lt, MESSAGES, REASONING, CONTENT)


def test_template_keeps_reasoning_of_past_turns(lt: LoadedTokenizer) -> None:
    history = [
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "Hello!", "reasoning_content": "Greet back."},
        {"role": "user", "content": "And now?"},
    ]
    r = render_record(lt, history, "Second thought.", "Done.")
    assert r.input_ids.count(THINK_OPEN) == 2 and r.input_ids.count(THINK_CLOSE) == 2
    assert "<think>Greet back.</think>Hello!" in r.text
    assert r.warnings == []


def test_template_dropping_reasoning(lt: LoadedTokenizer, tmp_path: Path) -> None:
    template = tmp_path / "kimi_like.jinja"
    template.write_text(DROPPING_TEMPLATE, encoding="utf-8")
    dropping = load_tokenizer(TokenizerSpec(DEEPSEEK_V4, chat_template=str(template)))
    assert dropping.template_source == f"file:{template}"
    r = render_record(dropping, MESSAGES[1:], REASONING, CONTENT)
    assert "reasoning_dropped_by_template" in codes(r)
    warning = next(w for w in r.warnings if w.code == "reasoning_dropped_by_template")
    assert "dropped the reasoning" in warning.message and warning.detail["in_rendered_text"] is False
    start = r.input_ids.index(THINK_OPEN)
    assert r.input_ids[start + 1] == THINK_CLOSE  # adjacent: an empty think block
    assert r.totals["reasoning_tokens_est"] == 0


def test_think_not_single_token(tiny_folder: Path) -> None:
    tiny = load_tokenizer(TokenizerSpec(str(tiny_folder)))
    assert tiny.template_source == "own"
    assert tiny.think_open_id is None and tiny.think_close_id is None
    r = render_record(tiny, [{"role": "user", "content": "hello"}], "let me think", "four")
    found = [w for w in r.warnings if w.code == "think_not_single_token"]
    assert [w.detail["delimiter"] for w in found] == ["<think>", "</think>"]
    assert "`<think>` encodes to 3 tokens ('<', 'think', '>') instead of a single token" in found[0].message
    assert "the draft model would train on text the target never sees" in found[0].message
    # the pieces are ordinary text chips; role markers and BOS/EOS are still recognised
    kinds = {c.piece: c.kind for c in r.chips}
    assert kinds["<"] == "text" and kinds["<|user|>"] == "role" and kinds["<s>"] == "bos_eos"
    assert "reasoning_dropped_by_template" not in codes(r)

    r = render_record(tiny, [{"role": "user", "content": "hello"}], "x", "y", expected_think_ids=(5, 6))
    assert "instead of the single id 5" in r.warnings[0].message


def test_unexpected_think_ids(lt: LoadedTokenizer) -> None:
    r = render_record(lt, MESSAGES, REASONING, CONTENT, expected_think_ids=(128798, 128799))  # DeepSeek-R1's
    messages = [w.message for w in r.warnings if w.code == "think_not_single_token"]
    assert len(messages) == 2 and "128821" in messages[0] and "128798" in messages[0]


def test_think_text_in_content(lt: LoadedTokenizer) -> None:
    r = render_record(lt, MESSAGES, "", "<think>leaked reasoning</think>The answer is 4.")
    warning = next(w for w in r.warnings if w.code == "think_text_in_content")
    assert warning.detail["field"] == "content" and warning.detail["tags"] == ["<think>", "</think>"]
    assert "think_not_single_token" not in codes(r)  # the tags did become single ids


def test_usage_mismatch(lt: LoadedTokenizer) -> None:
    n = render_record(lt, MESSAGES, REASONING, CONTENT).totals["assistant"]
    assert "completion_length_mismatch" not in codes(
        render_record(lt, MESSAGES, REASONING, CONTENT, usage_completion_tokens=n + 8)
    )
    r = render_record(lt, MESSAGES, REASONING, CONTENT, usage_completion_tokens=n + 100)
    warning = next(w for w in r.warnings if w.code == "completion_length_mismatch")
    assert warning.detail == {"retokenized": n, "usage": n + 100}
    # within 10% of a long completion: fine, even though more than 8 tokens apart
    long_reasoning = "Step by step, carefully. " * 200
    m = render_record(lt, MESSAGES, long_reasoning, CONTENT).totals["assistant"]
    assert m > 200
    assert "completion_length_mismatch" not in codes(
        render_record(lt, MESSAGES, long_reasoning, CONTENT, usage_completion_tokens=m + 12)
    )


def test_server_ids(lt: LoadedTokenizer) -> None:
    base = render_record(lt, MESSAGES, REASONING, CONTENT)
    prompt, completion = base.input_ids[: base.prompt_len], base.input_ids[base.prompt_len :]

    same = render_record(
        lt, MESSAGES, REASONING, CONTENT, server_prompt_ids=prompt, server_completion_ids=completion
    )
    assert same.warnings == [] and not any(c.differs for c in same.chips)

    # a completion cut by max_tokens has no EOS: not a difference
    cut = render_record(lt, MESSAGES, REASONING, CONTENT, server_completion_ids=completion[:-1])
    assert cut.warnings == []

    changed = list(completion)
    changed[3] = 42
    r = render_record(
        lt, MESSAGES, REASONING, CONTENT, server_prompt_ids=prompt, server_completion_ids=changed
    )
    assert [i for i, c in enumerate(r.chips) if c.differs] == [base.prompt_len + 3]
    warning = next(w for w in r.warnings if w.code == "server_ids_differ")
    assert warning.detail["part"] == "completion" and warning.detail["first_position"] == 3
    assert warning.detail["first_token_index"] == base.prompt_len + 3 and warning.detail["server_id"] == 42

    # the server split one of our tokens in two: only that chip is marked, the rest stays aligned
    split = completion[:5] + [42, 43] + completion[6:]
    r = render_record(lt, MESSAGES, REASONING, CONTENT, server_completion_ids=split)
    assert [i for i, c in enumerate(r.chips) if c.differs] == [base.prompt_len + 5]
    assert (
        next(w for w in r.warnings if w.code == "server_ids_differ").detail["server_len"]
        == len(completion) + 1
    )


def test_render_time_8k_tokens(lt: LoadedTokenizer) -> None:
    rng = random.Random(1234)
    words = (
        "the of and to in is that for it as with was on be by this are from at or an which have not has but "
        "def return import class self None True if else for while yield async await lambda 数据 模型 训练 "
        "ünïcödé naïve café λ ∑ → 42 3.14 2026 { } ( ) [ ] : ; , . = + - * / == != <= >= \n \n\n"
    ).split(" ")
    text = " ".join(rng.choice(words) for _ in range(9000))
    ids = lt.encode(text)[:7900]
    text = lt.decode(ids)
    cut = len(text) * 3 // 4
    reasoning, content = text[:cut], text[cut:]
    lt._info.clear()  # cold per-token cache: the worst case for the UI
    start = time.perf_counter()
    r = render_record(lt, [{"role": "user", "content": "Explain the code."}], reasoning, content)
    cold = time.perf_counter() - start
    start = time.perf_counter()
    render_record(lt, [{"role": "user", "content": "Explain the code."}], reasoning, content)
    warm = time.perf_counter() - start
    print(
        f"\nrender_record {r.totals['tokens']} tokens: cold {cold * 1000:.0f} ms, warm {warm * 1000:.0f} ms"
    )
    assert r.totals["tokens"] >= 7900
    assert cold < 3.0 and warm < 3.0  # sanity bound only; the UI target is < 300 ms


def test_empty_think_block_in_the_trained_span_warns(lt: LoadedTokenizer) -> None:
    # the prompt ends in a prefilled <think>; the trained span starts with </think>: it would teach skipping
    r = render_record(lt, MESSAGES, "", CONTENT)
    assert r.input_ids[r.prompt_len] == lt.think_close_id
    assert "empty_think_trained" in [w.code for w in r.warnings]
    assert "empty_think_trained" not in [w.code for w in render_record(lt, MESSAGES, REASONING, CONTENT).warnings]
