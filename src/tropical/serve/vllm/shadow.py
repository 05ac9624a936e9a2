"""The router's shadow of one vLLM instance: a sched WorkerState kept from what the streams show.

vLLM schedules its own iterations, so the policy decides on this copy instead:
- a request sent to the instance waits in the shadow's queue until its first token; the shadow's
  next iteration holds the decodes plus the oldest prompts that fit the token budget (vLLM's
  FCFS scheduler with chunked prefill), and is predicted to end one iteration after the last event;
- a first token completes the prompt (on a prefill instance it then waits for its hand-off; a
  hand-off reserves room on its decode instance until its first decode token lands there);
- every instance decodes all its running requests once per iteration, so the shadow's iteration
  count follows the stream that is furthest ahead (its tokens are observed iteration ends);
- a stream that ends drops its request.
Each event also feeds the instance's OnlineLatency with an observed prefill or decode time.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from tropical.core.latency.online import OnlineLatency
from tropical.core.latency.shape import BatchShape
from tropical.core.request import Request
from tropical.sched.rules import Role
from tropical.sched.worker import WorkerState


@dataclass(eq=False)
class Shadow:
    """One instance's WorkerState (``state``, what the policy reads) and the times of its last
    observed events, from which the online correction learns."""

    state: WorkerState
    latency: OnlineLatency
    last_event: float = 0.0
    prefill_since: dict[int, float] = field(default_factory=dict)

    def sent(self, req: Request, now: float) -> None:
        """``req`` (already in the queue by the policy's assignment) went to the instance."""
        self.state.reserve(req)
        self.prefill_since[req.id] = now
        self._replan(now)

    def prefilled(self, req: Request, now: float) -> None:
        """``req``'s first token arrived here: its prompt is done (and it decodes here, if this
        instance decodes)."""
        state = self.state
        self._learn_prefill(req, now)
        self._hold(req)
        state.complete_prefill(req, req.remaining_prompt, now)
        self._replan(now)

    def expect(self, req: Request) -> None:
        """A hand-off to this instance begins: room for ``req``'s KV is reserved."""
        self._hold(req)
        self.state.expect_landing(req)

    def landed(self, req: Request, now: float) -> None:
        """The first decode token of a handed-off request arrived: it decodes here now."""
        self.state.arrive_migrated(req)
        self.state.admit_inbox()
        self._replan(now)

    def decoded(self, req: Request, tokens: int, now: float) -> None:
        """``req``'s stream has ``tokens`` tokens: iterations up to that many have ended here."""
        state = self.state
        if req.id not in state.running:
            return
        target = req.step_base + tokens
        steps, batch, context = target - state.steps, state.batch_size, state.decode_context
        if steps <= 0:
            return
        if not state.waiting:
            mean_context = context + batch * (steps - 1) // 2
            self.latency.observe_decodes(batch, mean_context, steps, now - self.last_event)
        while state.steps < target and state.running:
            state.advance_decodes(min(target - state.steps, state.steps_to_next_finish()), now)
        self._replan(now)

    def dropped(self, req: Request, now: float) -> None:
        """``req`` ended or left this instance: forget it and free its room."""
        state = self.state
        state.abort(req)
        self.prefill_since.pop(req.id, None)
        self._replan(now)

    def _hold(self, req: Request) -> None:
        """Make sure ``req`` holds KV here: vLLM admitted it, so the shadow follows even when its
        own pool (which reserves whole lifetimes, vLLM only what is written) says it is full."""
        state = self.state
        if not state.reserve(req):
            state.holds[req.id] = 0

    def _learn_prefill(self, req: Request, now: float) -> None:
        """A prompt that ran with no decodes beside it on an instance that was otherwise idle."""
        since = self.prefill_since.pop(req.id, None)
        state = self.state
        if since is None or state.running or state.batch_prefills != 1 or state.waiting[0] is not req:
            return
        start = max(since, self.last_event)
        self.latency.observe(BatchShape.prefill(req.remaining_prompt, req.computed), now - start)

    def _replan(self, now: float) -> None:
        """The iteration vLLM is running now, as far as the shadow knows: decodes plus the oldest
        prompts within the token budget; predicted to end one iteration from ``now``."""
        state = self.state
        self.last_event = now
        state.batch_prefills = 0
        state.queued_work = (sum(state.prefill_cost(r) for r in state.waiting)
                             if state.role is Role.PREFILL else 0.0)
        heads: list[Request] = []
        budget = state.rules.token_budget - state.batch_size
        for req in state.waiting:
            if heads and req.remaining_prompt > budget:
                break
            heads.append(req)
            budget -= req.remaining_prompt
        state.start_prefills([(r, r.remaining_prompt) for r in heads])
        shape = BatchShape.of_batch([(r.remaining_prompt, r.computed) for r in heads],
                                    state.batch_size, state.decode_context)
        state.busy_until = now + state.latency.iteration_time(shape) if heads or state.running else now
