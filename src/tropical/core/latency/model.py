"""The predictor interface: every policy and the simulator ask only these questions.

A decode-only iteration must cost ``intercept(batch) + slope * total_context`` exactly, so the
simulator can advance a run of decode iterations in closed form; ``decode_line`` exposes that
line. Implementations: ``RooflineModel`` (calibrated on measured per-op profiles) and
``FittedModel`` (coefficients from the engine's profiler). ``iterations.py`` prices a lone
prefill and a decode batch through it.
"""

from __future__ import annotations

from abc import abstractmethod

from tropical.core.latency.shape import BatchShape


class LatencyModel:
    """Predicts seconds for one iteration on one replica, and for moving KV off it.

    A base class that every model derives from, not a Protocol: compiled, a call through a
    Protocol is a Python method call, its arguments and result boxed, and a simulation asks for
    hundreds of thousands of predictions (at the paper cluster's full trace rate, about 300,000
    iteration times per 3,000 requests). Not an ``ABC`` either: mypyc compiles a slotted
    dataclass deriving from one only without its metaclass."""

    __slots__ = ()

    @abstractmethod
    def iteration_time(self, shape: BatchShape) -> float:
        """Wall time of one forward pass over the batch, sampling included."""
        raise NotImplementedError

    @abstractmethod
    def decode_line(self, batch: int) -> tuple[float, float]:
        """(intercept, slope) with decode time = intercept + slope * total context tokens."""
        raise NotImplementedError

    @abstractmethod
    def transfer_time(self, tokens: int) -> float:
        """Time to migrate the KV of ``tokens`` tokens to another replica over the link."""
        raise NotImplementedError

    @property
    @abstractmethod
    def monotone(self) -> bool:
        """Does an iteration never get faster as its batch grows (a span added, a span given
        more new or cached tokens, a decode added or its context grown), and a prompt of a
        given length never slower for more of it cached? Floors on a prediction built from
        smaller batches (``sched.path2_floors``) hold only then."""
        raise NotImplementedError
