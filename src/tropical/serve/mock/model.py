"""What a mock worker pretends to serve: one replica of a simulator cluster preset (by default the
paper's, InternLM2-20B on two A100-80GB with TP=2), its KV capacity, and the latency model whose
predictions it sleeps, scaled by ``--mock-time-scale`` so a load test runs in sensible wall time.

The tokenizer is the tiny-random model's (trained in memory in milliseconds): a mock answers with
text a real tokenizer decodes, without loading a model.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from tropical.calibration.store import load_profile, load_roofline
from tropical.config import PRESETS
from tropical.core.latency.adjusted import AdjustedModel
from tropical.core.latency.model import LatencyModel
from tropical.core.specs import ModelSpec, ReplicaSpec, hardware
from tropical.engine.config import ModelConfig
from tropical.engine.tiny import CHATML_TEMPLATE, EOS_TOKEN, train_tokenizer
from tropical.engine.tokenizer import Tokenizer
from tropical.models import load_model_spec
from tropical.sched.step import SampleRow
from tropical.serve.options import ServeOptions

ANSWER = " The quick brown fox jumps over the lazy dog, and the model streams the answer back."
"""The text mock workers generate, token by token, over and over (never an end of sequence: a
request runs to its max tokens, as in a benchmark that ignores EOS)."""


@dataclass(frozen=True, slots=True)
class MockModel:
    """A mock worker's model: the name it serves, the latency model it sleeps (scaled), and the
    cache and context a replica of the preset has."""

    name: str
    latency: LatencyModel
    config: ModelConfig
    tokenizer: Tokenizer
    num_blocks: int
    block_size: int
    max_model_len: int
    note: str
    answer: tuple[int, ...]

    def tokens(self, samples: Sequence[SampleRow]) -> dict[int, int]:
        """The token each sampled row gets: the answer's next one for that request."""
        return {row.seq_id: self.answer[(row.seq_id + row.step) % len(self.answer)] for row in samples}


def mock_model(options: ServeOptions) -> MockModel:
    """The replica ``--mock-cluster`` names, priced by its calibrated roofline (or ``--profile``)."""
    preset = PRESETS[options.mock_cluster]
    spec = load_model_spec(preset["model"])
    replica = ReplicaSpec(spec, hardware(preset["gpu"]), preset["tp"])
    base = load_profile(options.profile) if options.profile else load_roofline(replica)
    scale = options.mock_time_scale
    latency = AdjustedModel(base, scale, transfer_scale=scale)
    tokenizer = _tokenizer()
    priced = f"latency profile {options.profile}" if options.profile else "its calibrated roofline"
    note = (f"mock workers: {spec.name} on {preset['tp']}x {replica.gpu.name} ({options.mock_cluster}), "
            f"sleeping {priced} x{scale:g}")
    return MockModel(f"mock-{spec.name}", latency, _config(spec, tokenizer), tokenizer,
                     replica.kv_capacity_tokens // options.block_size, options.block_size,
                     min(options.max_model_len, spec.max_context), note,
                     tuple(tokenizer.encode(ANSWER)))


def _tokenizer() -> Tokenizer:
    raw = train_tokenizer()
    eos = raw.token_to_id(EOS_TOKEN)
    assert eos is not None, f"the tiny tokenizer lacks {EOS_TOKEN}"
    return Tokenizer(raw, None, [eos], CHATML_TEMPLATE)


def _config(spec: ModelSpec, tokenizer: Tokenizer) -> ModelConfig:
    """The preset model's shape, with the vocabulary of the tokenizer the mock speaks."""
    return ModelConfig(spec.hidden, spec.num_layers, spec.num_q_heads, spec.num_kv_heads, spec.head_dim,
                       spec.intermediate, tokenizer.vocab_size, max_position_embeddings=spec.max_context)
