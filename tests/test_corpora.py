"""The offline training mixture: three kinds of text, evaluation parts never trained on, raw prompts."""

from __future__ import annotations

import pytest

from trtspec.errors import UsageError
from trtspec.train.corpora import DEFAULT_WEIGHTS, corpus_samples, source_samples
from trtspec.train.data import Sample, encode_prompt, load_samples


@pytest.mark.parametrize("source", ["chat", "prose", "code"])
def test_evaluation_part_is_never_trained_on(source):
    train = source_samples(source, evaluation=False)
    held = source_samples(source, evaluation=True)
    assert train and held
    assert not {s for s in train} & {s for s in held}
    assert len(held) < len(train) / 5


def test_mix_keeps_the_weights_in_every_prefix():
    got = corpus_samples("mix:200")
    assert len(got) == 200
    chat = sum(1 for s in got if s.messages is not None)
    raw = sum(1 for s in got if s.raw)
    assert chat + raw == 200
    assert abs(chat / 200 - DEFAULT_WEIGHTS["chat"]) < 0.05
    head = got[:40]
    assert 0.3 < sum(1 for s in head if s.messages is not None) / 40 < 0.7  # interleaved, not blocks


def test_mix_weights_and_single_sources_through_load_samples():
    only_code = load_samples(["mix:30:code=1"])
    assert len(only_code) == 30 and all(s.raw and s.messages is None for s in only_code)
    assert sum("def " in s.text or "import " in s.text or "class " in s.text for s in only_code) >= 15
    assert len(load_samples(["prose:5", "code-eval:3"])) == 8
    with pytest.raises(UsageError, match="unknown mix source"):
        load_samples(["mix:10:poetry=1"])
    with pytest.raises(UsageError, match="use prose"):
        load_samples(["prose:many"])


def test_raw_samples_skip_the_chat_template(demo_paths):
    from trtspec.checkpoint.target import load_hf_causal_lm
    from trtspec.load import load_tokenizer

    tok = load_tokenizer(load_hf_causal_lm(demo_paths["target"]))
    text = "abc def"
    raw = encode_prompt(tok, Sample(text=text, raw=True), chat=True)
    chat = encode_prompt(tok, Sample(text=text), chat=True)
    assert raw == list(tok(text)["input_ids"])
    if getattr(tok, "chat_template", None):
        assert chat != raw


def test_chat_turns_leave_the_evaluation_conversations_unseen():
    """chat-turns cuts every user turn of the training conversations: many times chat's items, every item
    ends on a user turn, and no long message of a held-out conversation is in it (a different cut of the
    same conversation would leak its replies)."""
    turns = corpus_samples("chat-turns")
    held = source_samples("chat", evaluation=True)
    assert len(turns) > 10 * len(source_samples("chat", evaluation=False))
    assert all(s.messages[0][0] == "user" and s.messages[-1][0] == "user" for s in turns)
    seen = {text for s in turns for _, text in s.messages}
    held_long = {text for s in held for _, text in s.messages if len(text) > 60}
    assert held_long and not held_long & seen
    assert corpus_samples("chat-turns:50") == turns[:50]
    with pytest.raises(UsageError, match="chat-eval"):
        corpus_samples("chat-turns-eval")
