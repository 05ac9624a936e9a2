"""Logprobs, stop token ids and grammars on the router's side: events carry their tokens' logprobs
(held-back tokens too) and the first event the prompt's; a stop token id ends a stream without its
text; a request's grammar sees every token, across a migration, and starts afresh on a rerun."""

from __future__ import annotations

import types
from dataclasses import dataclass, field, replace
from typing import Any

from tests.factories import linear_cluster, make_request
from tests.serve.fake_cluster import (
    FakeWorker,
    StubTokenizer,
    finished,
    run_virtual,
    start_router,
    submission,
)
from tropical.core.request import Request
from tropical.core.sampling import SamplingParams, TokenLogprobs
from tropical.core.slo import SLO
from tropical.sched.registry import make_policy
from tropical.sched.step import PromptRow, SampleRow
from tropical.serve.inflight import InFlight
from tropical.serve.metrics import ServerMetrics
from tropical.serve.streams import Event, RequestHandle, Submission
from tropical.serve.workers.messages import Step, StepDone

E_ACUTE = (0xC3, 0xA9)  # "é": two byte tokens, the first makes no text on its own


class ByteDecoder:
    def decode(self, ids: list[int]) -> str:
        return bytes(ids).decode("utf-8", errors="replace")


def scored(token: int) -> TokenLogprobs:
    return TokenLogprobs(token, -float(token) / 100, 1)


def taken(h: RequestHandle) -> list[Event]:
    events = []
    while not h.events.empty():
        events.append(h.events.get_nowait())
    return events


def test_held_back_tokens_keep_their_logprobs_and_the_first_event_has_the_prompts() -> None:
    h = RequestHandle.of(make_request(), Submission([1, 2], 8, SamplingParams(logprobs=0), [], True),
                         ByteDecoder())
    prompt = [None, scored(2)]
    h.emit([ord("a")], [scored(ord("a"))], prompt)
    h.emit([E_ACUTE[0]], [scored(E_ACUTE[0])])
    assert taken(h) == [Event("a", 1, logprobs=[scored(ord("a"))], prompt_logprobs=prompt)]
    h.emit([E_ACUTE[1]], [scored(E_ACUTE[1])])
    h.emit([ord("b")], [scored(ord("b"))])
    h.emit([ord("!")], [scored(ord("!"))], silent=True)
    h.end("stop")
    assert taken(h) == [Event("é", 2, logprobs=[scored(t) for t in E_ACUTE]),
                        Event("b", 2, "stop", logprobs=[scored(ord("b")), scored(ord("!"))])]
    assert h.completion_tokens == 5


@dataclass
class Grammar:
    """Allows tokens 3 and 5 only; records what it hears."""

    accepted: list[int] = field(default_factory=list)

    def allowed(self) -> bytes:
        return ((1 << 3) | (1 << 5)).to_bytes(4, "little")

    def accept(self, token: int) -> None:
        self.accepted.append(token)


def scoring_worker(worker: FakeWorker, rows: list[SampleRow], prompts: list[PromptRow], stop_at: int) -> None:
    """Make ``worker`` sample the highest token its rows' grammar allows (9 without one; 8, the stop
    token, at step ``stop_at``), with logprobs and prompt logprobs, and record its rows."""
    run = worker._run

    async def _run(self: FakeWorker, command: Any) -> Any:
        done = await run(command)
        if not isinstance(command, Step):
            return done
        rows.extend(command.spec.samples)
        prompts.extend(command.spec.prompts)
        tokens = {row.seq_id: 8 if row.step == stop_at else
                  9 if row.allowed is None else int.from_bytes(row.allowed, "little").bit_length() - 1
                  for row in command.spec.samples}
        prompt = {p.seq_id: [scored(t) for t in p.targets] for p in command.spec.prompts}
        return StepDone(tokens, done.seconds, logprobs={rid: scored(t) for rid, t in tokens.items()},
                        prompt_logprobs=prompt)

    worker._run = types.MethodType(_run, worker)  # type: ignore[method-assign]


def test_a_grammar_and_logprobs_cross_a_migration_and_a_stop_token_ends_the_stream_unseen() -> None:
    req = Request(0, 0.0, 400, 12, SLO(1.0, 0.1))
    grammars: list[Grammar] = []

    def grammar() -> Grammar:
        grammars.append(Grammar())
        return grammars[-1]

    params = SamplingParams(logprobs=0, prompt_logprobs=0, stop_token_ids=(8,))
    rows: list[SampleRow] = []
    prompts: list[PromptRow] = []

    async def main(loop: Any) -> tuple[Any, RequestHandle, list[Event]]:
        policy = make_policy("disagg")
        fake = start_router(loop, policy, linear_cluster(2, 50_000).build(policy), {0: 400})
        for worker in fake.workers:
            scoring_worker(worker, rows, prompts, stop_at=4)
        sub = replace(submission(req), prompt_ids=list(range(400)), params=params, constraint=grammar)
        handle = fake.router.submit(sub)
        events = await finished(handle)
        await fake.router.stop()
        return fake, handle, events

    fake, handle, events = run_virtual(main)
    assert handle.req.prefill_worker == 0 and handle.req.decode_worker == 1
    assert len(grammars) == 1 and grammars[0].accepted == [5, 5, 5, 5, 8]
    assert all(row.allowed is not None for row in rows)
    assert events[-1].finish_reason == "stop" and handle.completion_tokens == 5
    assert "".join(e.text for e in events) == "ffff"  # the stub's text of token 5; 8's ("i") unseen
    assert [s.token for e in events for s in e.logprobs] == [5, 5, 5, 5, 8]
    prompt = events[0].prompt_logprobs
    assert prompt is not None and prompt[0] is None and [s.token for s in prompt[1:]] == list(range(1, 400))
    assert [t for p in prompts for t in p.targets] == list(range(1, 400))
    assert fake.router.cluster.workers[0].kv.used_blocks == 0


def test_each_run_of_a_request_gets_a_fresh_grammar() -> None:
    made: list[Grammar] = []

    def grammar() -> Grammar:
        made.append(Grammar())
        return made[-1]

    inflight = InFlight(StubTokenizer(), ServerMetrics(), lambda: 0.0)
    req = make_request(prompt=3)
    sub = Submission([1, 2, 3], 4, SamplingParams(), [], False, constraint=grammar)
    inflight.track(req, sub)
    inflight.track(req, sub)
    assert len(made) == 2 and inflight.sequences[req.id].constraint is made[1]


@dataclass
class BrokenGrammar(Grammar):
    """Refuses its third token, as a grammar that cannot go on does."""

    def accept(self, token: int) -> None:
        super().accept(token)
        if len(self.accepted) == 3:
            raise ValueError("response_format: token 5 does not follow the grammar")


def test_a_grammar_that_cannot_go_on_fails_its_request_alone() -> None:
    broken, plain = Request(0, 0.0, 40, 12, SLO(1.0, 0.1)), Request(1, 0.0, 40, 6, SLO(1.0, 0.1))

    async def main(loop: Any) -> tuple[Any, list[Event], list[Event], RequestHandle]:
        policy = make_policy("colocated")
        fake = start_router(loop, policy, linear_cluster(1, 50_000).build(policy), {0: 40, 1: 40})
        scoring_worker(fake.workers[0], [], [], stop_at=-1)
        failing = fake.router.submit(replace(submission(broken), constraint=BrokenGrammar))
        other = fake.router.submit(submission(plain))
        events = await finished(failing), await finished(other)
        await fake.router.stop()
        return fake, *events, other

    fake, failed_events, other_events, other = run_virtual(main)
    assert failed_events[-1].error is not None and "does not follow the grammar" in failed_events[-1].error
    assert failed_events[-1].status == 500 and sum(e.tokens for e in failed_events) == 2
    assert other_events[-1].finish_reason == "length" and other.completion_tokens == 6
    assert fake.router.cluster.where(broken.id) is None
    assert fake.router.cluster.workers[0].kv.used_blocks == 0
