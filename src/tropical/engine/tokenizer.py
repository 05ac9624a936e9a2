"""One tokenizer interface over HF tokenizer.json directories and GGUF vocabularies.

Serving needs encode/decode, the stop ids and the chat template; both model sources give the
same `Tokenizer`, built on the `tokenizers` library, with templates rendered by jinja2.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

from jinja2.exceptions import TemplateError
from jinja2.sandbox import ImmutableSandboxedEnvironment
from tokenizers import AddedToken, decoders, models, pre_tokenizers
from tokenizers import Tokenizer as RawTokenizer

from tropical.engine.gguf_reader import GGUFVocab

CONTROL_TOKEN = 3
USER_DEFINED_TOKEN = 4


@dataclass
class Tokenizer:
    """Text <-> ids plus the model's special ids and chat template."""

    raw: RawTokenizer
    bos_token_id: int | None = None
    eos_token_ids: list[int] = field(default_factory=list)
    chat_template: str | None = None

    @classmethod
    def from_hf_dir(cls, path: str | Path) -> Tokenizer:
        """Load tokenizer.json and the special tokens/template from tokenizer_config.json."""
        root = Path(path)
        tok_file = root / "tokenizer.json"
        if not tok_file.is_file():
            raise ValueError(f"tokenizer.json missing in {root}")
        raw = RawTokenizer.from_file(str(tok_file))
        config = read_json(root / "tokenizer_config.json")
        bos = token_id(raw, config.get("bos_token"))
        eos = token_id(raw, config.get("eos_token"))
        eos_ids = merge_ids([eos], read_json(root / "generation_config.json").get("eos_token_id"))
        return cls(raw, bos, eos_ids, hf_chat_template(root, config))

    @classmethod
    def from_gguf_vocab(cls, vocab: GGUFVocab) -> Tokenizer:
        """Rebuild the GPT-2 style byte-level BPE that llama.cpp's 'gpt2' tokenizer model describes."""
        if vocab.model != "gpt2":
            raise ValueError(f"unsupported GGUF tokenizer model {vocab.model!r} (only 'gpt2' BPE)")
        ids = {token: i for i, token in enumerate(vocab.tokens)}
        merges = [_merge_pair(m) for m in vocab.merges]
        raw = RawTokenizer(models.BPE(ids, merges, fuse_unk=False))
        raw.pre_tokenizer = gguf_pre_tokenizer(vocab.pre)
        raw.decoder = decoders.ByteLevel()
        raw.add_special_tokens(typed_tokens(vocab, CONTROL_TOKEN, special=True))
        raw.add_tokens(typed_tokens(vocab, USER_DEFINED_TOKEN, special=False))
        eos_ids = [] if vocab.eos_token_id is None else [vocab.eos_token_id]
        return cls(raw, vocab.bos_token_id, eos_ids, vocab.chat_template)

    @property
    def vocab_size(self) -> int:
        return self.raw.get_vocab_size(with_added_tokens=True)

    def encode(self, text: str) -> list[int]:
        """Encode as-is: special tokens written in the text (from a chat template) are kept."""
        return self.raw.encode(text, add_special_tokens=False).ids

    def encode_without_gil(self, text: str) -> list[int]:
        """``encode`` through ``encode_batch``, the one call of `tokenizers` that releases the GIL
        while it works: a server tokenizing a long prompt in a thread keeps its event loop running
        (``encode`` held it for the whole 14 s of a 3M-character text, measured)."""
        return self.raw.encode_batch([text], add_special_tokens=False)[0].ids

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        return self.raw.decode(ids, skip_special_tokens=skip_special_tokens)

    def apply_chat_template(self, messages: list[dict], add_generation_prompt: bool = True) -> str:
        """Render messages the way transformers does, so prompts match the model's training."""
        if not self.chat_template:
            raise ValueError("this model has no chat template; send a plain completion prompt instead")
        template = template_env().from_string(self.chat_template)
        return template.render(
            messages=messages,
            add_generation_prompt=add_generation_prompt,
            bos_token=self.token_text(self.bos_token_id),
            eos_token=self.token_text(self.eos_token_ids[0] if self.eos_token_ids else None),
        )

    def token_text(self, token: int | None) -> str:
        return "" if token is None else (self.raw.id_to_token(token) or "")


def read_json(path: Path) -> dict:
    """An optional JSON file: absent means empty, malformed is an error naming the file."""
    if not path.is_file():
        return {}
    try:
        return json.loads(path.read_text())
    except json.JSONDecodeError as e:
        raise ValueError(f"malformed JSON in {path}: {e}") from e


def token_id(raw: RawTokenizer, token: str | dict | None) -> int | None:
    """Resolve a tokenizer_config special token (a string or an AddedToken dict) to its id."""
    if isinstance(token, dict):
        token = token.get("content")
    return None if token is None else raw.token_to_id(token)


def merge_ids(ids: list[int | None], extra: int | list[int] | None) -> list[int]:
    """Union of stop ids in first-seen order, dropping unknowns."""
    extra_list = extra if isinstance(extra, list) else [extra]
    return list(dict.fromkeys(i for i in [*ids, *extra_list] if i is not None))


def hf_chat_template(root: Path, config: dict) -> str | None:
    """The template from chat_template.jinja (newer transformers) or tokenizer_config.json."""
    jinja_file = root / "chat_template.jinja"
    if jinja_file.is_file():
        return jinja_file.read_text()
    template = config.get("chat_template")
    if isinstance(template, list):
        named = {t.get("name"): t.get("template") for t in template}
        return named.get("default") or next(iter(named.values()), None)
    return template


def _merge_pair(merge: str) -> tuple[str, str]:
    """One GGUF BPE merge rule, two tokens separated by a space, as the pair BPE takes."""
    left, space, right = merge.partition(" ")
    if not space:
        raise ValueError(f"GGUF merge rule {merge!r} is not two tokens separated by a space")
    return left, right


def gguf_pre_tokenizer(pre: str | None) -> pre_tokenizers.PreTokenizer:
    """Byte-level pre-tokenizer; SmolLM's variant also splits digits one by one."""
    byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    if pre == "smollm":
        return pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True), byte_level])
    return byte_level


def typed_tokens(vocab: GGUFVocab, token_type: int, special: bool) -> list[AddedToken]:
    """Tokens of one GGUF token type, to be matched whole before BPE runs."""
    if not vocab.token_types:
        return []
    return [
        AddedToken(token, special=special, normalized=False)
        for token, kind in zip(vocab.tokens, vocab.token_types, strict=True)
        if kind == token_type
    ]


def template_env() -> ImmutableSandboxedEnvironment:
    """The jinja2 environment transformers uses for chat templates."""
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    env.filters["tojson"] = lambda value, indent=None: json.dumps(value, ensure_ascii=False, indent=indent)
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
    return env


def raise_exception(message: str) -> Any:
    raise TemplateError(message)
