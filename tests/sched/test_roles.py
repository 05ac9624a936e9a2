"""Roles both ways: idle prefill workers are lent to the multiplexing side and drain back."""

from tests.factories import make_request, make_worker, start_decoding
from tropical.sched.roles import RoleSwitch
from tropical.sched.rules import BatchRules, Role, decodes, takes_arrivals

RULES = {Role.PREFILL: BatchRules(prefill_first=True), Role.MULTIPLEX: BatchRules(chunked=True)}


def cluster():
    return [make_worker(Role.PREFILL, RULES[Role.PREFILL], wid=0),
            make_worker(Role.PREFILL, RULES[Role.PREFILL], wid=1),
            make_worker(Role.MULTIPLEX, RULES[Role.MULTIPLEX], wid=2)]


def test_an_idle_prefill_worker_is_lent_only_while_another_idles_too():
    workers = cluster()
    workers[0].enqueue(make_request(0))
    switch = RoleSwitch()
    switch.update(workers, 10.0, pressed=False, rules=RULES)
    assert [w.role for w in workers] == [Role.PREFILL, Role.PREFILL, Role.MULTIPLEX]
    workers[0].waiting.clear()
    switch.update(workers, 10.0, pressed=False, rules=RULES)
    assert workers[1].role is Role.MULTIPLEX and workers[1].rules is RULES[Role.MULTIPLEX]
    assert workers[0].role is Role.PREFILL                     # one prefill worker always stays


def test_under_pressure_a_lent_worker_drains_then_comes_back():
    workers = cluster()
    switch = RoleSwitch(hold=5.0)
    switch.update(workers, 0.0, pressed=False, rules=RULES)
    lent = workers[1]
    start_decoding(lent, make_request(1, output=20))
    switch.update(workers, 1.0, pressed=True, rules=RULES)
    assert switch.returning == set()                           # held for 5 s first
    switch.update(workers, 6.0, pressed=True, rules=RULES)
    assert switch.returning == {lent.id} and lent.role is Role.MULTIPLEX   # still decoding
    lent.abort(next(iter(lent.running.values())))
    switch.update(workers, 7.0, pressed=True, rules=RULES)
    assert lent.role is Role.PREFILL and lent.rules is RULES[Role.PREFILL]
    assert workers[2].role is Role.MULTIPLEX                   # never lent, never taken back


def test_every_role_but_prefill_decodes_and_every_role_but_decode_takes_arrivals():
    assert [role for role in Role if not decodes(role)] == [Role.PREFILL]
    assert [role for role in Role if not takes_arrivals(role)] == [Role.DECODE]
    worker, req = make_worker(Role.MULTIPLEX, RULES[Role.MULTIPLEX]), make_request(0, prompt=100, output=10)
    assert worker.kv_tokens_needed(req) == req.kv_tokens
    worker.become(Role.PREFILL, RULES[Role.PREFILL])
    assert worker.kv_tokens_needed(req) == req.prompt_len
