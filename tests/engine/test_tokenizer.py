"""Tokenizer from an HF directory and from GGUF vocab data agree on a tiny trained BPE."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from tokenizers import Tokenizer as RawTokenizer
from tokenizers import decoders, models, pre_tokenizers, trainers

from tropical.engine.gguf_reader import GGUFVocab
from tropical.engine.tokenizer import Tokenizer

SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
CORPUS = [
    "What is the capital of France? The capital of France is Paris.",
    "The quick brown fox jumps over the lazy dog 12345 times.",
    "Serving language models needs a tokenizer, a scheduler and a KV cache.",
]
TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
TEXT = "What is the capital of Spain? 42 foxes!"


@pytest.fixture(scope="module")
def raw() -> RawTokenizer:
    tok = RawTokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=320, special_tokens=SPECIALS, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
    )
    tok.train_from_iterator(CORPUS, trainer)
    return tok


@pytest.fixture()
def hf_dir(tmp_path: Path, raw: RawTokenizer) -> Path:
    raw.save(str(tmp_path / "tokenizer.json"))
    config = {"bos_token": "<|im_start|>", "eos_token": {"content": "<|im_end|>"}, "chat_template": TEMPLATE}
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(config))
    return tmp_path


def gguf_vocab(raw: RawTokenizer) -> GGUFVocab:
    """What convert_hf_to_gguf stores for a byte-level BPE: tokens by id, 'a b' merges, types."""
    model = json.loads(raw.to_str())["model"]
    tokens = sorted(model["vocab"], key=model["vocab"].get)
    merges = [m if isinstance(m, str) else " ".join(m) for m in model["merges"]]
    types = [3 if t in SPECIALS else 1 for t in tokens]
    ids = model["vocab"]
    scores = [0.0] * len(tokens)
    return GGUFVocab(tokens, scores, types, merges, ids["<|im_start|>"], ids["<|im_end|>"], TEMPLATE)


def test_hf_round_trip(hf_dir: Path) -> None:
    tok = Tokenizer.from_hf_dir(hf_dir)
    ids = tok.encode(TEXT)
    assert tok.decode(ids) == TEXT
    assert len(ids) < len(TEXT.encode())
    assert tok.bos_token_id == tok.raw.token_to_id("<|im_start|>")
    assert tok.eos_token_ids == [tok.raw.token_to_id("<|im_end|>")]


def test_generation_config_adds_eos(hf_dir: Path) -> None:
    (hf_dir / "generation_config.json").write_text(json.dumps({"eos_token_id": [2, 0]}))
    assert Tokenizer.from_hf_dir(hf_dir).eos_token_ids == [2, 0]


def test_chat_template_renders(hf_dir: Path) -> None:
    tok = Tokenizer.from_hf_dir(hf_dir)
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]
    text = tok.apply_chat_template(messages)
    expected = "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n"
    assert text == expected + "<|im_start|>assistant\n"
    assert not tok.apply_chat_template(messages, add_generation_prompt=False).endswith("assistant\n")
    ids = tok.encode(text)
    assert ids.count(tok.raw.token_to_id("<|im_start|>")) == 3
    assert tok.decode(ids) == "system\nBe brief.\nuser\nHi\nassistant\n"


def test_chat_template_file_wins(hf_dir: Path) -> None:
    (hf_dir / "chat_template.jinja").write_text("{{ messages[0]['content'] }}!")
    assert Tokenizer.from_hf_dir(hf_dir).apply_chat_template([{"role": "user", "content": "x"}]) == "x!"


def test_missing_template_is_clear(hf_dir: Path) -> None:
    (hf_dir / "tokenizer_config.json").write_text("{}")
    with pytest.raises(ValueError, match="no chat template"):
        Tokenizer.from_hf_dir(hf_dir).apply_chat_template([{"role": "user", "content": "x"}])


def test_missing_tokenizer_json(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="tokenizer.json missing"):
        Tokenizer.from_hf_dir(tmp_path)


def test_gguf_vocab_matches_hf(hf_dir: Path, raw: RawTokenizer) -> None:
    hf_tok = Tokenizer.from_hf_dir(hf_dir)
    gguf_tok = Tokenizer.from_gguf_vocab(gguf_vocab(raw))
    chat = hf_tok.apply_chat_template([{"role": "user", "content": TEXT}])
    for text in (TEXT, chat, CORPUS[1]):
        assert gguf_tok.encode(text) == hf_tok.encode(text)
    assert gguf_tok.decode(gguf_tok.encode(TEXT)) == TEXT
    assert gguf_tok.apply_chat_template([{"role": "user", "content": TEXT}]) == chat
    assert (gguf_tok.bos_token_id, gguf_tok.eos_token_ids) == (hf_tok.bos_token_id, hf_tok.eos_token_ids)


def test_gguf_merge_rule_without_a_space_is_named(raw: RawTokenizer) -> None:
    vocab = gguf_vocab(raw)
    vocab.merges = [*vocab.merges, "broken"]
    with pytest.raises(ValueError, match="GGUF merge rule 'broken' is not two tokens"):
        Tokenizer.from_gguf_vocab(vocab)


def test_gguf_unsupported_model(raw: RawTokenizer) -> None:
    vocab = gguf_vocab(raw)
    vocab.model = "llama"
    with pytest.raises(ValueError, match="unsupported GGUF tokenizer model 'llama'"):
        Tokenizer.from_gguf_vocab(vocab)


def test_encoding_without_the_gil_gives_the_same_ids(hf_dir: Path) -> None:
    tok = Tokenizer.from_hf_dir(hf_dir)
    text = "Hello, world! <|im_start|>déjà vu 123\n" * 50
    assert tok.encode_without_gil(text) == tok.encode(text) and tok.encode(text)
