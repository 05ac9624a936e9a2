"""Admission asks first the worker that last passed each test: the answer is always the one a
look at every worker gives, whatever died, changed role or changed size since."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from tests.factories import make_request, make_worker
from tropical.sched.admission import Witnesses, admission_error
from tropical.sched.rules import Role

ROLES = st.sampled_from([Role.PREFILL, Role.MULTIPLEX, Role.COLOCATED, Role.DECODE])
WORKER = st.tuples(ROLES, st.sampled_from([200, 1_000, 5_000]), st.booleans())
STEP = st.tuples(st.integers(0, 7), WORKER, st.integers(1, 4_000), st.integers(1, 2_000))


@settings(max_examples=150, deadline=None)
@given(st.lists(WORKER, min_size=1, max_size=8), st.lists(STEP, max_size=25))
def test_witnesses_answer_as_a_full_look_does_after_any_change(fleet, steps) -> None:
    workers = [make_worker(role, kv_tokens=kv, wid=i) for i, (role, kv, _) in enumerate(fleet)]
    for worker, (_, _, alive) in zip(workers, fleet, strict=True):
        worker.alive = alive
    witnesses = Witnesses()
    for rid, (which, (role, kv, alive), prompt, output) in enumerate(steps):
        changed = workers[which % len(workers)]
        replacement = make_worker(role, kv_tokens=kv, wid=changed.id)
        replacement.alive = alive
        workers[changed.id] = replacement if rid % 2 else changed
        changed.alive, changed.role = alive, role
        req = make_request(rid, prompt=prompt, output=output)
        assert admission_error(req, workers, None, witnesses) == admission_error(req, workers)
