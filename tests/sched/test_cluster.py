"""The Cluster's events and the effects they return, on hand-sized clusters."""

from __future__ import annotations

from tests.factories import make_request, make_worker
from tropical.sched.baselines import DisaggPolicy
from tropical.sched.cluster import Assigned, Cluster, Fail, Free, Migrate, Wake
from tropical.sched.rules import BatchRules, Role


def disagg(decode_kv: int = 100_000) -> Cluster:
    """One prefill worker (0) and one decode worker (1)."""
    policy = DisaggPolicy(4096, num_prefill=1)
    workers = [make_worker(Role.PREFILL, policy.rules(Role.PREFILL), wid=0),
               make_worker(Role.DECODE, policy.rules(Role.DECODE), kv_tokens=decode_kv, wid=1)]
    return Cluster(workers, policy)


def prefill(cluster: Cluster, req, now: float = 0.0) -> list:
    """Arrive, run the prompt on worker 0 and book it; the booking's effects."""
    cluster.arrive(req, now)
    batch = cluster.plan(0, now)
    assert batch is not None and batch.prefills[0][0] is req
    return cluster.book(0, batch, now + 1.0).effects


def test_arrival_assigns_then_wakes_and_refusals_fail():
    cluster = disagg()
    req, huge = make_request(0), make_request(1, prompt=200_000)
    assert cluster.arrive(req, 0.0) == [Assigned(req, 0), Wake(0)]
    assert cluster.where(0) == 0 and req.prefill_worker == 0
    [fail] = cluster.arrive(huge, 0.0)
    assert isinstance(fail, Fail) and "KV cache" in fail.reason and cluster.where(1) is None


def test_plan_stamps_the_prefill_start_once():
    cluster = disagg()
    req = make_request(0, prompt=5000)
    cluster.workers[0].rules = BatchRules(prefill_first=True, chunked=True, token_budget=2048)
    cluster.arrive(req, 0.0)
    first = cluster.plan(0, 1.0)
    cluster.book(0, first, 2.0)
    cluster.plan(0, 2.0)
    assert req.prefill_start == 1.0 and req.computed == 2048


def test_a_finished_prompt_migrates_and_joins_the_decoder_when_its_kv_lands():
    cluster = disagg()
    req = make_request(0, output=3)
    effects = prefill(cluster, req)
    assert effects == [Migrate(req, 0, 1, req.prompt_len)] and cluster.where(0) == 1
    assert cluster.migrated(req, 0, 1) == [Free(0, 0), Wake(1), Wake(0)]
    batch = cluster.plan(1, 2.0)
    assert batch.decode_count == 1 and cluster.workers[0].kv.used_blocks == 0


def test_a_migration_without_room_stalls_until_a_finish_frees_kv():
    cluster = disagg(decode_kv=1500)
    first, second = make_request(0, prompt=1000, output=2), make_request(1, prompt=1000, output=2)
    [move] = prefill(cluster, first)
    cluster.migrated(first, 0, 1)
    assert prefill(cluster, second, now=1.0) == [] and cluster.stalled == [(second, 0)]
    decode = cluster.plan(1, 3.0)
    booking = cluster.book(1, decode, 3.1)
    assert [r for r, _ in booking.finished] == [first]
    assert Migrate(second, 0, 1, second.prompt_len) in booking.effects and not cluster.stalled


def test_abort_frees_the_requests_kv_and_wakes_its_worker():
    cluster = disagg()
    cluster.workers[0].rules = BatchRules(prefill_first=True, chunked=True, token_budget=2048)
    req = make_request(0, prompt=5000)
    cluster.arrive(req, 0.0)
    cluster.book(0, cluster.plan(0, 0.0), 1.0)
    assert cluster.workers[0].kv.used_blocks > 0 and req.computed == 2048
    assert cluster.abort(0, 1.5) == [Free(0, 0), Wake(0)]
    assert cluster.workers[0].kv.used_blocks == 0 and not cluster.workers[0].waiting
    assert cluster.plan(0, 1.5) is None and cluster.abort(0, 1.6) == []


def test_abort_of_a_stalled_request_frees_its_prompt_and_forgets_the_stall():
    cluster = disagg(decode_kv=1500)
    first, second = make_request(0, prompt=1000, output=2), make_request(1, prompt=1000, output=2)
    prefill(cluster, first)
    prefill(cluster, second, now=1.0)
    assert cluster.abort(1, 1.5) == [Free(0, 1), Wake(0)]
    prefill_kv = cluster.workers[0].kv
    assert not cluster.stalled and prefill_kv.used_blocks == prefill_kv.blocks_for(first.prompt_len)


def test_abort_on_the_way_frees_both_sides_once_the_kv_lands():
    cluster = disagg()
    req = make_request(0, output=3)
    prefill(cluster, req)
    assert cluster.abort(0, 1.5) == [Wake(1)]
    assert cluster.workers[1].kv.used_blocks == 0 and not cluster.workers[1].incoming
    assert cluster.migrated(req, 0, 1) == [Free(0, 0), Free(1, 0), Wake(0)]
    assert cluster.workers[0].kv.used_blocks == 0 and not cluster.workers[1].inbox


def test_a_failed_migration_frees_both_sides_and_fails_the_request():
    cluster = disagg()
    req = make_request(0, output=3)
    prefill(cluster, req)
    effects = cluster.migration_failed(req, 0, 1, "KV migration failed: boom")
    assert Fail(req, "KV migration failed: boom") in effects
    assert {Free(0, 0), Free(1, 0)} <= set(effects)
    assert cluster.workers[0].kv.used_blocks == cluster.workers[1].kv.used_blocks == 0


def test_losing_the_last_decoder_returns_its_requests_and_fails_stalled_ones():
    cluster = disagg(decode_kv=1500)
    first, second = make_request(0, prompt=1000, output=5), make_request(1, prompt=1000, output=5)
    prefill(cluster, first)
    cluster.migrated(first, 0, 1)
    prefill(cluster, second, now=1.0)
    lost, effects = cluster.worker_died(1, 2.0)
    assert lost == [first] and Fail(second, "no live worker is left to decode it") in effects
    assert "none left decodes" in cluster.arrive(make_request(2), 2.0)[0].reason


def test_a_revived_worker_starts_empty_under_its_old_role():
    cluster = disagg()
    req = make_request(0, output=3)
    prefill(cluster, req)
    cluster.migrated(req, 0, 1)
    cluster.worker_died(1, 2.0)
    cluster.worker_revived(1, 3.0)
    revived = cluster.workers[1]
    assert revived.alive and revived.role is Role.DECODE and revived.kv.used_blocks == 0
    assert not revived.running and not revived.inbox
