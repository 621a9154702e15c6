"""A character-level tokenizer for the tiny demo models (real tokenizer.json, loads with AutoTokenizer)."""

from __future__ import annotations

from pathlib import Path

SPECIALS = ["<unk>", "<s>", "</s>"]
CHARS = [chr(c) for c in range(32, 127)] + ["\n"]


def write_char_tokenizer(out: str | Path, vocab_size: int) -> Path:
    """Write tokenizer.json + tokenizer_config.json: ids 0-2 specials, then printable ASCII and newline."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {t: i for i, t in enumerate(SPECIALS + CHARS)}
    if len(vocab) > vocab_size:
        raise ValueError(f"vocab_size {vocab_size} < {len(vocab)} characters")
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    tok.decoder = decoders.Fuse()
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>", bos_token="<s>", eos_token="</s>")
    fast.chat_template = (
        "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
        "{% if add_generation_prompt %}assistant: {% endif %}"
    )
    out = Path(out)
    fast.save_pretrained(out)
    return out
