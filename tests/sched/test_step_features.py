"""What a step asks of the sampler beyond a plain request: rows carry the output, the prompt, the
banned stop tokens and the grammar's mask only when a request's features need them; prompt spans
of a prompt-logprobs request name the tokens their positions predict; recorded tokens reach the
grammar and stop tokens end a request only past min_tokens."""

from __future__ import annotations

from dataclasses import dataclass, field

from tropical.core.request import Request
from tropical.core.sampling import SamplingParams, TokenLogprobs
from tropical.core.slo import SLO
from tropical.sched.batching import Batch
from tropical.sched.step import (
    PromptRow,
    SampleRow,
    StepOutput,
    TokenSequence,
    record_step,
    step_spec,
)

EOS = frozenset({0})


@dataclass
class Recorder:
    """A grammar allowing everything, recording what it is told."""

    accepted: list[int] = field(default_factory=list)

    def allowed(self) -> bytes:
        return b"\xff\xff\xff\xff"

    def accept(self, token: int) -> None:
        self.accepted.append(token)


def sequence(rid: int, params: SamplingParams, prompt: int = 6, output: tuple[int, ...] = (),
             ignore_eos: bool = False, constraint: Recorder | None = None) -> TokenSequence:
    req = Request(rid, 0.0, prompt, 10, SLO(1.0, 1.0))
    return TokenSequence(req, list(range(10, 10 + prompt)), params, ignore_eos, list(output), constraint)


def decoding_row(seq: TokenSequence) -> SampleRow:
    spec = step_spec(Batch([], 1, seq.cached), [seq.req.id], {seq.req.id: seq}, EOS)
    return spec.samples[0]


def test_a_plain_request_row_carries_nothing_more() -> None:
    row = decoding_row(sequence(0, SamplingParams(temperature=0.5), output=(3, 4)))
    assert row == SampleRow(0, SamplingParams(temperature=0.5), 2) and row.plain


def test_rows_carry_only_what_their_features_need() -> None:
    presence = decoding_row(sequence(0, SamplingParams(presence_penalty=1.0), output=(3, 4)))
    assert (presence.output, presence.prompt, presence.banned, presence.allowed) == ((3, 4), (), (), None)
    repetition = decoding_row(sequence(0, SamplingParams(repetition_penalty=1.1), prompt=3, output=(3,)))
    assert (repetition.output, repetition.prompt) == ((3,), (10, 11, 12))
    scored = decoding_row(sequence(0, SamplingParams(logprobs=2), output=(3,)))
    assert not scored.plain and (scored.output, scored.prompt, scored.banned) == ((), (), ())
    grammar = decoding_row(sequence(0, SamplingParams(), output=(3,), constraint=Recorder()))
    assert grammar.allowed == b"\xff\xff\xff\xff" and not grammar.plain


def test_min_tokens_bans_stop_tokens_until_reached() -> None:
    params = SamplingParams(min_tokens=3, stop_token_ids=(7,))
    assert decoding_row(sequence(0, params, output=(3, 4))).banned == (0, 7)
    assert decoding_row(sequence(0, params, output=(3, 4, 5))).banned == ()
    assert decoding_row(sequence(0, params, output=(3, 4), ignore_eos=True)).banned == (7,)


def test_stop_tokens_end_a_request_past_min_tokens_and_reach_its_grammar() -> None:
    grammar = Recorder()
    seqs = {0: sequence(0, SamplingParams(stop_token_ids=(7,)), output=(3,), constraint=grammar),
            1: sequence(1, SamplingParams(stop_token_ids=(7,), min_tokens=5), output=(3,)),
            2: sequence(2, SamplingParams(), output=(3,), ignore_eos=True),
            3: sequence(3, SamplingParams(), output=(3,))}
    assert record_step(StepOutput({0: 7, 1: 7, 2: 0, 3: 0}), seqs, EOS).ended == [0, 3]
    assert grammar.accepted == [7] and seqs[1].output == [3, 7]


class Failing(Recorder):
    """A grammar that cannot go on: its mask or its next token raises, as llguidance's may."""

    def __init__(self, at: str) -> None:
        super().__init__()
        self.at = at

    def allowed(self) -> bytes:
        if self.at == "allowed":
            raise ValueError("the grammar failed")
        return super().allowed()

    def accept(self, token: int) -> None:
        if self.at == "accept":
            raise ValueError(f"token {token} does not follow the grammar")
        super().accept(token)


def test_a_grammar_that_cannot_go_on_marks_its_request_alone() -> None:
    seqs = {0: sequence(0, SamplingParams(), output=(3,), constraint=Failing("accept")),
            1: sequence(1, SamplingParams(), output=(3,), constraint=Recorder())}
    recorded = record_step(StepOutput({0: 5, 1: 5}), seqs, EOS)
    assert recorded.ended == [] and recorded.failed == {0: "token 5 does not follow the grammar"}
    assert seqs[0].output == [3, 5] and seqs[1].failure is None
    masked = sequence(2, SamplingParams(), output=(3,), constraint=Failing("allowed"))
    assert decoding_row(masked).allowed is None and masked.failure == "the grammar failed"


def test_an_eos_a_finished_grammar_forced_ends_its_request_short_of_min_tokens() -> None:
    """The sampler lets a finished grammar's end of sequence through a min_tokens ban; the
    request then ends, where an eos without a grammar could not have been drawn."""
    seqs = {0: sequence(0, SamplingParams(min_tokens=5), output=(3,), constraint=Recorder()),
            1: sequence(1, SamplingParams(min_tokens=5), output=(3,))}
    assert record_step(StepOutput({0: 0, 1: 0}), seqs, EOS).ended == [0]


def test_prompt_chunks_name_the_tokens_their_positions_predict() -> None:
    seq = sequence(0, SamplingParams(prompt_logprobs=1), prompt=6)
    first = step_spec(Batch([(seq.req, 4, 0)]), [], {0: seq}, EOS)
    last = step_spec(Batch([(seq.req, 2, 4)]), [], {0: seq}, EOS)
    assert first.prompts == [PromptRow(0, [11, 12, 13, 14], 1)] and not first.samples
    assert last.prompts == [PromptRow(0, [15], 1)] and len(last.samples) == 1
    one = sequence(1, SamplingParams(prompt_logprobs=1), prompt=1)
    assert step_spec(Batch([(one.req, 1, 0)]), [], {1: one}, EOS).prompts == []
    plain = sequence(2, SamplingParams(), prompt=6)
    assert step_spec(Batch([(plain.req, 6, 0)]), [], {2: plain}, EOS).prompts == []


def test_logprobs_gather_in_order() -> None:
    seq = sequence(0, SamplingParams(prompt_logprobs=0, logprobs=0), prompt=4)
    first, second = TokenLogprobs(11, -1.0, 1), TokenLogprobs(12, -2.0, 3)
    record_step(StepOutput({}, {}, {0: [first, second]}), {0: seq}, EOS)
    record_step(StepOutput({0: 5}, {0: TokenLogprobs(5, -0.5, 1)}, {0: [TokenLogprobs(13, -3.0, 2)]}),
                {0: seq}, EOS)
    assert [s.token for s in seq.prompt_logprobs] == [11, 12, 13] and seq.logprobs[0].token == 5
