"""The sampler's vLLM features on hand-made logits: penalties, logit bias, min-tokens bans and a
grammar's mask change the greedy choice as vLLM's formulas say; logprobs are the log-softmax of
the logits the request asked about; plain rows take the plain path."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest
import torch

from tropical.core.sampling import SamplingParams
from tropical.engine import sampling
from tropical.engine.sampling import apply_penalties, grammar_mask, position_logprobs, sample, sample_rows
from tropical.sched.step import SampleRow

LOGITS = torch.tensor([2.0, -1.0, 0.5, 3.0, 0.9])


def row(params: SamplingParams, **kwargs: object) -> SampleRow:
    return SampleRow(0, params, 0, **kwargs)  # type: ignore[arg-type]


def greedy(params: SamplingParams, logits: torch.Tensor = LOGITS, **kwargs: object) -> int:
    return sample_rows(logits[None], [row(params, **kwargs)])[0][0]


def bitmask(allowed: set[int], vocab: int) -> bytes:
    words = [0] * -(-vocab // 32)
    for token in allowed:
        words[token // 32] |= 1 << (token % 32)
    return b"".join(w.to_bytes(4, "little") for w in words)


def test_penalties_follow_vllms_formulas() -> None:
    """Repetition 2 over prompt and output (positive logits halved, negative doubled), then
    frequency 0.5 per output occurrence and presence 0.25 per token in the output."""
    params = SamplingParams(repetition_penalty=2.0, frequency_penalty=0.5, presence_penalty=0.25)
    got = apply_penalties(LOGITS, prompt=(0,), output=(3, 3, 1), params=params)
    expected = [2.0 / 2, -1.0 * 2 - 0.5 - 0.25, 0.5, 3.0 / 2 - 2 * 0.5 - 0.25, 0.9]
    assert got.tolist() == pytest.approx(expected)
    assert greedy(SamplingParams()) == 3
    assert greedy(params, prompt=(0,), output=(3, 3, 1)) == 0


def test_repetition_penalty_alone_reaches_prompt_tokens() -> None:
    params = SamplingParams(repetition_penalty=4.0)
    assert greedy(params, prompt=(3,)) == 0
    assert greedy(params, prompt=(1,)) == 3


def test_logit_bias_and_banned_tokens_change_the_greedy_choice() -> None:
    assert greedy(SamplingParams(logit_bias=((2, 3.0),))) == 2
    assert greedy(SamplingParams(logit_bias=((3, -100.0),))) == 0
    assert greedy(SamplingParams(min_tokens=1), banned=(3, 0)) == 4


def test_a_grammar_mask_restricts_greedy_and_sampled_tokens() -> None:
    vocab, allowed = 50, {5, 40}
    logits = torch.randn(vocab, generator=torch.Generator().manual_seed(0))
    mask = bitmask(allowed, vocab)
    assert greedy(SamplingParams(), logits, allowed=mask) == max(allowed, key=lambda t: float(logits[t]))
    drawn = {greedy(SamplingParams(temperature=1.0, seed=seed), logits, allowed=mask) for seed in range(40)}
    assert drawn == allowed


def test_a_finished_grammar_outranks_min_tokens() -> None:
    """Under min_tokens the end of sequence is banned; when a finished grammar allows only it, the
    grammar wins (banning everything would leave no token to draw)."""
    only_eos = bitmask({4}, 5)
    assert greedy(SamplingParams(min_tokens=3), allowed=only_eos, banned=(4,)) == 4
    assert greedy(SamplingParams(min_tokens=3), allowed=bitmask({2, 4}, 5), banned=(4,)) == 2


def test_grammar_mask_reads_llguidances_layout() -> None:
    mask = grammar_mask(bitmask({0, 31, 33}, 64), 70)
    assert mask.nonzero().flatten().tolist() == [0, 31, 33] and mask.shape == (70,)
    with pytest.raises(ValueError, match="32-bit words"):
        grammar_mask(b"\x01\x02", 10)


def test_logprobs_are_the_log_softmax_with_sorted_top_and_true_rank() -> None:
    logits = torch.randn(3, 50, generator=torch.Generator().manual_seed(1)) * 3
    rows = [SampleRow(i, SamplingParams(temperature=1.0, seed=i, logprobs=4), 0) for i in range(3)]
    tokens, logprobs = sample_rows(logits, rows)
    reference = logits.log_softmax(-1)
    for i, token in enumerate(tokens):
        scored = logprobs[i]
        assert scored.token == token
        assert scored.logprob == pytest.approx(float(reference[i, token]), abs=1e-5)
        assert scored.rank == int((reference[i] >= reference[i, token]).sum())
        values, ids = reference[i].topk(4)
        assert [t for t, _ in scored.top] == ids.tolist()
        assert [v for _, v in scored.top] == pytest.approx(values.tolist(), abs=1e-5)
        assert [v for _, v in scored.top] == sorted((v for _, v in scored.top), reverse=True)


def test_logprobs_are_raw_unless_processed_ones_are_asked_for() -> None:
    """Raw: before the bias and temperature (vLLM's default); processed: of the logits the token
    was drawn from."""
    bias = ((2, 3.0),)
    raw = sample_rows(LOGITS[None], [row(SamplingParams(logit_bias=bias, logprobs=0))])[1][0]
    assert raw.token == 2 and raw.logprob == pytest.approx(float(LOGITS.log_softmax(-1)[2]))
    assert raw.rank == 4 and raw.top == ()
    processed = SamplingParams(temperature=0.5, seed=1, logit_bias=bias, logprobs=1,
                               processed_logprobs=True)
    scored = sample_rows(LOGITS[None], [row(processed)])[1][0]
    biased = LOGITS.clone()
    biased[2] += 3.0
    assert scored.logprob == pytest.approx(float((biased / 0.5).log_softmax(-1)[scored.token]))


def test_a_grammar_masked_token_has_no_probability() -> None:
    scored = sample_rows(LOGITS[None], [row(SamplingParams(logprobs=0), allowed=bitmask({1}, 5))])[1][0]
    assert scored.token == 1 and scored.logprob == pytest.approx(0.0) and scored.rank == 1


def test_plain_rows_take_the_plain_path_and_draw_as_sample_does(monkeypatch: pytest.MonkeyPatch) -> None:
    logits = torch.randn(4, 64, generator=torch.Generator().manual_seed(2))
    params = [SamplingParams(), SamplingParams(temperature=0.7, seed=5),
              SamplingParams(temperature=1.2, top_k=8, seed=6),
              SamplingParams(temperature=0.9, top_p=0.8, seed=7)]
    rows = [SampleRow(i, p, 3) for i, p in enumerate(params)]
    expected = sample(logits, params, [sampling.step_generator(p, 3) for p in params])
    scored_rows = [SampleRow(i, replace(p, logprobs=2), 3) for i, p in enumerate(params)]
    with_logprobs = sample_rows(logits, scored_rows)[0]

    def refuse(*_: object) -> None:
        raise AssertionError("a plain row took the processing path")

    monkeypatch.setattr(sampling, "_sample_processed", refuse)
    assert sample_rows(logits, rows) == (expected, {})
    assert with_logprobs == expected


def test_prompt_position_logprobs_score_each_target() -> None:
    logits = torch.randn(3, 20, generator=torch.Generator().manual_seed(3))
    scored = position_logprobs(logits, [4, 0, 19], 2)
    reference = logits.log_softmax(-1)
    assert [s.logprob for s in scored] == pytest.approx([float(reference[i, t]) for i, t in
                                                          enumerate([4, 0, 19])], abs=1e-6)
    assert all(len(s.top) == 2 and s.top[0][1] >= s.top[1][1] for s in scored)


def test_bias_beyond_the_vocabulary_is_named() -> None:
    with pytest.raises(ValueError, match="logit_bias names token 9"):
        greedy(SamplingParams(logit_bias=((9, 1.0),)))


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"presence_penalty": 2.5}, "presence_penalty must be in"),
    ({"frequency_penalty": -3}, "frequency_penalty must be in"),
    ({"repetition_penalty": 0}, "repetition_penalty must be"),
    ({"repetition_penalty": math.inf}, "repetition_penalty must be"),
    ({"logit_bias": ((1, 101.0),)}, "logit_bias of token 1"),
    ({"logit_bias": ((-1, 1.0),)}, "logit_bias token ids"),
    ({"min_tokens": -1}, "min_tokens must be"),
    ({"stop_token_ids": (-2,)}, "stop_token_ids"),
    ({"logprobs": -1}, "logprobs must be"),
    ({"prompt_logprobs": -1}, "prompt_logprobs must be"),
])
def test_bad_feature_values_are_refused_by_name(kwargs: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        SamplingParams(**kwargs)
