"""The router's shadow of a vLLM instance follows the streams as the simulator's worker would."""

from __future__ import annotations

import pytest

from tests.factories import linear_model, make_request
from tropical.core.latency.online import OnlineLatency
from tropical.core.latency.shape import BatchShape
from tropical.engine.runner import worker_state
from tropical.sched.rules import BatchRules, Role
from tropical.serve.vllm.shadow import Shadow


def shadow(role: Role = Role.MULTIPLEX, blocks: int = 1000) -> Shadow:
    online = OnlineLatency(linear_model())
    return Shadow(worker_state(0, role, BatchRules(), blocks, 16, online), online)


def queued(s: Shadow, rid: int, prompt: int = 100, output: int = 10, now: float = 0.0):  # noqa: ANN201
    req = make_request(rid, now, prompt, output)
    s.state.enqueue(req)
    s.sent(req, now)
    return req


def test_a_sent_prompt_is_in_the_iteration_now_running_until_its_first_token() -> None:
    s = shadow()
    req = queued(s, 0)
    assert s.state.batch_prefills == 1 and s.state.busy_until > 0
    s.prefilled(req, 0.02)
    assert list(s.state.running) == [0] and not s.state.waiting and req.first_token == 0.02


def test_the_iteration_count_follows_the_stream_furthest_ahead() -> None:
    s = shadow()
    a, b = queued(s, 0), queued(s, 1)
    s.prefilled(a, 0.01)
    s.prefilled(b, 0.01)
    s.decoded(a, 4, 0.05)
    assert s.state.steps == 3
    assert s.state.generated(b) == 4, "every running request decodes in each iteration"
    s.decoded(b, 3, 0.06)
    assert s.state.steps == 3, "a stream behind the count does not move it back"


def test_a_prefill_instance_holds_the_kv_until_the_hand_off_and_the_decoder_reserves_it() -> None:
    prefill, decode = shadow(Role.PREFILL), shadow(Role.DECODE)
    req = queued(prefill, 0)
    prefill.prefilled(req, 0.02)
    assert prefill.state.kv.used_blocks == 7 and not prefill.state.running
    decode.expect(req)
    prefill.dropped(req, 0.02)
    assert prefill.state.kv.used_blocks == 0 and decode.state.kv.used_blocks == 7
    decode.landed(req, 0.05)
    assert list(decode.state.running) == [0] and not decode.state.incoming


def test_an_ended_stream_frees_its_room() -> None:
    s = shadow()
    req = queued(s, 0)
    s.prefilled(req, 0.01)
    s.dropped(req, 0.02)
    assert s.state.kv.used_blocks == 0 and not s.state.running and s.state.busy_until == 0.02


def test_a_request_vllm_admitted_joins_even_when_the_shadow_pool_is_full() -> None:
    s = shadow(blocks=8)
    a, b = queued(s, 0), queued(s, 1)
    s.prefilled(a, 0.01)
    s.prefilled(b, 0.01)
    assert set(s.state.running) == {0, 1}


def test_prefill_workers_queue_their_predicted_work_behind_the_running_prompt() -> None:
    s = shadow(Role.PREFILL)
    queued(s, 0, prompt=1500)
    queued(s, 1, prompt=1500)
    assert s.state.batch_prefills == 1
    assert s.state.queued_work == pytest.approx(s.state.prefill_cost(s.state.waiting[1]))


def test_observed_decodes_scale_later_predictions() -> None:
    online = OnlineLatency(linear_model())
    predicted = online.iteration_time(BatchShape.decode(2, 200))
    for _ in range(50):
        online.observe_decodes(2, 200, 10, 10 * 2 * predicted)
    assert online.decode_scale == pytest.approx(2.0, rel=0.01)
    assert online.iteration_time(BatchShape.decode(2, 200)) == pytest.approx(2 * predicted, rel=0.01)
    assert online.prefill_scale == 1.0


def test_an_outlandish_observation_is_ignored() -> None:
    online = OnlineLatency(linear_model())
    online.observe(BatchShape.prefill(100), 1000.0)
    assert online.prefill_scale == 1.0 and online.observations == 0
