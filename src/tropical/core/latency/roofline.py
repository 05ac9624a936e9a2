"""A roofline latency model with calibrated efficiency factors.

Each layer, on one tensor-parallel shard, runs its kernels one after another; each kernel costs a
fixed launch overhead plus a roofline time (compute or memory bound, at the fractions of peak that
the measured profiles show). The op classes below are the single definition of every formula: the
calibration fits their factors with these same classes, evaluated on numpy arrays (prefill
attention row by row: it is priced at nearly every prediction, and typed as floats it compiles to
arithmetic on doubles instead of Python objects, an eighth of a simulation's instructions).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any, Final

from tropical.core.latency.model import LatencyModel
from tropical.core.latency.shape import BatchShape
from tropical.core.specs import HardwareSpec, ModelSpec, ReplicaSpec

Number = Any  # a float, or a numpy array when the calibration evaluates many rows at once
_CACHED_SHAPES: Final = 1 << 16
"""Token counts past ``_LISTED_TOKENS`` whose layer time a model keeps; past that it starts over
(memory stays bounded)."""
_LISTED_TOKENS: Final = 1 << 14
"""Token counts below this have their layer time kept in a list indexed by the count (at most
128 kB of slots per model: chunks, budgets and decode batches are below it; a whole long prompt
in one iteration is not, and is rarer)."""
_UNSET: Final = -1.0
"""A list slot not computed yet (every time is nonnegative)."""


@dataclass(frozen=True, slots=True)
class OpEfficiency:
    """One op class's calibrated roofline: fractions of peak reached and a fixed cost per launch.

    ``memory`` is a fraction of HBM bandwidth, or of link bandwidth for communication ops.
    ``sharpness`` blends the compute and memory times as a p-norm: large p is the textbook max,
    small p charges the slow transition that measured GEMMs show near the ridge point.
    """

    compute: float = 1.0
    memory: float = 1.0
    overhead: float = 0.0
    sharpness: float = 4.0


@dataclass(frozen=True, slots=True)
class Efficiency:
    """All calibrated factors of one GPU kind (see data/calibration/README.md)."""

    gemm: OpEfficiency
    norm: OpEfficiency
    rope: OpEfficiency
    activation: OpEfficiency
    residual: OpEfficiency
    prefill_attention: OpEfficiency
    decode_attention: OpEfficiency
    all_reduce: OpEfficiency
    transfer: OpEfficiency
    prefill_tile_waste: float = 0.0
    decode_per_sequence: float = 0.0
    iteration_overhead: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Efficiency:
        """Inverse of to_dict; unknown or missing keys raise, so a stale file fails loudly."""
        fields: dict[str, Any] = {name: OpEfficiency(**value) if isinstance(value, dict) else float(value)
                                  for name, value in data.items()}
        return cls(**fields)


def soft_roofline(compute_s: Number, memory_s: Number, sharpness: float) -> Number:
    """p-norm of the two bound times: max() as p grows, smooth across the ridge point (of
    floats, or of numpy rows: calibration evaluates many at once)."""
    if isinstance(compute_s, float) and isinstance(memory_s, float):
        return soft_roofline_of(compute_s, memory_s, sharpness)
    return (compute_s**sharpness + memory_s**sharpness) ** (1.0 / sharpness)


def soft_roofline_of(compute_s: float, memory_s: float, sharpness: float) -> float:
    """``soft_roofline`` of two times (nonnegative floats) with ``math.pow``, the same C
    ``pow``: compiled, ``**`` dispatches on objects, and prefill attention, priced at every
    prediction of an iteration with a prompt in it, spent a twentieth of a simulation there."""
    return math.pow(math.pow(compute_s, sharpness) + math.pow(memory_s, sharpness), 1.0 / sharpness)


@dataclass(frozen=True, slots=True)
class Shard:
    """The per-GPU slice of one layer under tensor parallelism (heads, MLP and vocab split)."""

    hidden: int
    q_heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    vocab: int
    dtype_bytes: int

    @classmethod
    def of(cls, model: ModelSpec, tp: int) -> Shard:
        """KV heads are replicated when tp exceeds them, as vLLM does."""
        return cls(model.hidden, -(-model.num_q_heads // tp), max(model.num_kv_heads // tp, 1),
                   model.head_dim, -(-model.intermediate // tp), -(-model.vocab // tp),
                   model.dtype_bytes)

    @property
    def kv_token_bytes(self) -> int:
        """Key and value of one token in one layer on this shard."""
        return 2 * self.kv_heads * self.head_dim * self.dtype_bytes

    @property
    def q_token_bytes(self) -> int:
        return self.q_heads * self.head_dim * self.dtype_bytes

    def gemm_dims(self) -> dict[str, tuple[int, int]]:
        """(input, output) width of each weight GEMM of a layer, named as Vidur's profiles."""
        q, kv = self.q_heads * self.head_dim, self.kv_heads * self.head_dim
        return {"attn_pre_proj": (self.hidden, q + 2 * kv), "attn_post_proj": (q, self.hidden),
                "mlp_up_proj": (self.hidden, 2 * self.intermediate),
                "mlp_down_proj": (self.intermediate, self.hidden)}

    def stream_bytes(self) -> dict[str, int]:
        """HBM bytes per token of each memory-bound elementwise op (reads plus writes)."""
        d = self.dtype_bytes
        return {"norm": 2 * self.hidden * d,
                "rope": 2 * (self.q_heads + self.kv_heads) * self.head_dim * d,
                "activation": 3 * self.intermediate * d,
                "residual": 3 * self.hidden * d}


@dataclass(frozen=True, slots=True)
class Gemm:
    """A weight GEMM over n tokens: FLOPs versus weight plus activation bytes."""

    flop_s: float
    weight_s: float
    token_s: float
    overhead: float
    sharpness: float

    @classmethod
    def build(cls, eff: OpEfficiency, gpu: HardwareSpec, k: int, out: int, dtype: int) -> Gemm:
        bw = eff.memory * gpu.hbm_bandwidth
        return cls(2.0 * k * out / (eff.compute * gpu.peak_flops), k * out * dtype / bw,
                   (k + out) * dtype / bw, eff.overhead, eff.sharpness)

    def seconds(self, n: Number) -> Number:
        return self.overhead + soft_roofline(n * self.flop_s, self.weight_s + n * self.token_s,
                                             self.sharpness)


@dataclass(frozen=True, slots=True)
class Linear:
    """An op whose time is a fixed overhead plus a cost per unit: memory-bound streams (norms,
    rope, activation, adds: per token) and transfers over the GPU link (per byte)."""

    overhead: float
    unit_s: float

    @classmethod
    def stream(cls, eff: OpEfficiency, bandwidth: float, bytes_per_token: float) -> Linear:
        return cls(eff.overhead, bytes_per_token / (eff.memory * bandwidth))

    @classmethod
    def all_reduce(cls, eff: OpEfficiency, gpu: HardwareSpec, tp: int) -> Linear:
        """Ring all-reduce: each GPU sends and receives 2(tp-1)/tp of the buffer."""
        return cls(eff.overhead, 2.0 * (tp - 1) / tp / (eff.memory * gpu.link_bandwidth))

    @classmethod
    def copy(cls, eff: OpEfficiency, gpu: HardwareSpec) -> Linear:
        return cls(eff.overhead, 1.0 / (eff.memory * gpu.link_bandwidth))

    def seconds(self, n: Number) -> Number:
        return self.overhead + n * self.unit_s


@dataclass(frozen=True, slots=True)
class PrefillAttention:
    """Causal attention of the prefill spans: pair FLOPs versus reading cached and new KV."""

    pair_s: float
    waste: float
    kv_s: float
    qo_s: float
    overhead: float
    sharpness: float

    @classmethod
    def build(cls, eff: Efficiency, gpu: HardwareSpec, shard: Shard) -> PrefillAttention:
        op, bw = eff.prefill_attention, eff.prefill_attention.memory * gpu.hbm_bandwidth
        pair_flops = 4.0 * shard.head_dim * shard.q_heads
        return cls(pair_flops / (op.compute * gpu.peak_flops), eff.prefill_tile_waste,
                   shard.kv_token_bytes / bw, 2 * shard.q_token_bytes / bw, op.overhead,
                   op.sharpness)

    def seconds(self, tokens: float, pairs: float, cached: float) -> float:
        """``waste`` extra keys per query stand for diagonal tiles and per-query fixed work."""
        compute = (pairs + self.waste * tokens) * self.pair_s
        memory = (cached + tokens) * self.kv_s + tokens * self.qo_s
        return self.overhead + soft_roofline_of(compute, memory, self.sharpness)


@dataclass(frozen=True, slots=True)
class DecodeAttention:
    """Attention of single-token queries: reads every context token's KV, linear in context."""

    context_s: float
    sequence_s: float
    overhead: float

    @classmethod
    def build(cls, eff: Efficiency, gpu: HardwareSpec, shard: Shard) -> DecodeAttention:
        bw = eff.decode_attention.memory * gpu.hbm_bandwidth
        per_sequence = eff.decode_per_sequence + (shard.kv_token_bytes + 2 * shard.q_token_bytes) / bw
        return cls(shard.kv_token_bytes / bw, per_sequence, eff.decode_attention.overhead)

    def intercept(self, count: Number) -> Number:
        return self.overhead + count * self.sequence_s

    def seconds(self, count: Number, context: Number) -> Number:
        return self.intercept(count) + context * self.context_s


class RooflineModel(LatencyModel):
    """LatencyModel of one replica: layers x (GEMMs + elementwise + attention + all-reduce)."""

    def __init__(self, replica: ReplicaSpec, efficiency: Efficiency) -> None:
        model, gpu, tp = replica.model, replica.gpu, replica.tp
        shard = Shard.of(model, tp)
        self.replica = replica
        self.efficiency = efficiency
        self._layers = model.num_layers
        self._gemms = tuple(Gemm.build(efficiency.gemm, gpu, k, out, model.dtype_bytes)
                            for k, out in shard.gemm_dims().values())
        self._lm_head = Gemm.build(efficiency.gemm, gpu, model.hidden, shard.vocab, model.dtype_bytes)
        self._prefill = PrefillAttention.build(efficiency, gpu, shard)
        self._decode = DecodeAttention.build(efficiency, gpu, shard)
        self._fixed, self._per_token = self._linear_layer_terms(efficiency, gpu, shard, tp)
        self._transfer = Linear.copy(efficiency.transfer, gpu)
        self._kv_bytes_per_shard = model.kv_bytes_per_token / tp
        self._decode_lines: dict[int, tuple[float, float]] = {}
        self._layer_seconds: list[float] = []
        self._long_layer_seconds: dict[int, float] = {}
        self._head_seconds: list[float] = []
        self._decode_intercepts: dict[int, float] = {}
        self._overhead = efficiency.iteration_overhead

    def __reduce__(self) -> tuple[type[RooflineModel], tuple[ReplicaSpec, Efficiency]]:
        """Rebuilt from what it was built from (the caches refill), so that it pickles compiled
        too (see tropical.native)."""
        return RooflineModel, (self.replica, self.efficiency)

    @staticmethod
    def _linear_layer_terms(eff: Efficiency, gpu: HardwareSpec, shard: Shard,
                            tp: int) -> tuple[float, float]:
        """Per-layer (fixed, per-token) seconds of everything linear in tokens."""
        per_layer = {"norm": 2, "rope": 1, "activation": 1, "residual": 1}
        streams = [(Linear.stream(getattr(eff, name), gpu.hbm_bandwidth, nbytes), per_layer[name])
                   for name, nbytes in shard.stream_bytes().items()]
        if tp > 1:  # two all-reduces of the tokens' hidden states, linear in tokens too
            reduce = Linear.all_reduce(eff.all_reduce, gpu, tp)
            token_s = shard.hidden * shard.dtype_bytes * reduce.unit_s
            streams.append((Linear(reduce.overhead, token_s), 2))
        fixed = sum(op.overhead * count for op, count in streams)
        per_token = sum(op.unit_s * count for op, count in streams)
        return fixed, per_token

    def _dense(self, tokens: int, sampled: int) -> float:
        """Everything but attention: per-layer GEMMs and streams, the LM head, the CPU overhead.
        Both parts are kept by size in lists indexed by it (looked up here, one call fewer per
        prediction): the simulator and the toggle price many iterations of the same token count
        (chunks, budgets, decode batches), and at most one row per sequence is sampled. Kept in
        dicts keyed by the count, the two lookups made this function a twentieth of a full-rate
        ``tropical+`` run's time (compiled, sampled by perf)."""
        layers = self._layer_seconds[tokens] if tokens < len(self._layer_seconds) else _UNSET
        if layers < 0.0:
            layers = self._all_layers(tokens)
        head = self._head_seconds[sampled] if sampled < len(self._head_seconds) else _UNSET
        if head < 0.0:
            head = self._lm_head.seconds(sampled) if sampled else 0.0
            _keep(self._head_seconds, sampled, head)
        return self._overhead + layers + head

    def _all_layers(self, tokens: int) -> float:
        """Every layer's GEMMs and streams over ``tokens``, kept for ``_dense`` (counts past
        ``_LISTED_TOKENS`` in a dict, which starts over at ``_CACHED_SHAPES``)."""
        if tokens >= _LISTED_TOKENS:
            seconds = self._long_layer_seconds.get(tokens)
            if seconds is not None:
                return seconds
        layer = self._fixed + tokens * self._per_token
        for gemm in self._gemms:
            layer += gemm.seconds(tokens)
        seconds = self._layers * layer
        if tokens < _LISTED_TOKENS:
            _keep(self._layer_seconds, tokens, seconds)
            return seconds
        if len(self._long_layer_seconds) >= _CACHED_SHAPES:
            self._long_layer_seconds.clear()
        self._long_layer_seconds[tokens] = seconds
        return seconds

    def iteration_time(self, shape: BatchShape) -> float:
        """Wall time of one forward pass; decode-only shapes go through the cached line."""
        if not shape.prefill_tokens:
            if not shape.decode_count:
                return 0.0
            intercept, slope = self.decode_line(shape.decode_count)
            return intercept + slope * shape.decode_context
        tokens = shape.prefill_tokens + shape.decode_count
        attention = self._prefill.seconds(shape.prefill_tokens, shape.prefill_pairs,
                                          shape.prefill_cached)
        if shape.decode_count:
            per_context = self._decode.context_s
            attention += self._decode_intercept(shape.decode_count) + shape.decode_context * per_context
        return self._dense(tokens, shape.num_prefills + shape.decode_count) + self._layers * attention

    def _decode_intercept(self, count: int) -> float:
        """``DecodeAttention``'s part that does not grow with context, cached by batch size (its
        rate per context token is a float: the sum is then computed on doubles)."""
        intercept = self._decode_intercepts.get(count)
        if intercept is None:
            intercept = self._decode_intercepts[count] = self._decode.intercept(count)
        return intercept

    def decode_line(self, batch: int) -> tuple[float, float]:
        """(intercept, slope) of a decode-only iteration of ``batch`` sequences, cached."""
        line = self._decode_lines.get(batch)
        if line is None:
            if batch <= 0:
                return 0.0, 0.0
            intercept = self._dense(batch, batch) + self._layers * self._decode.intercept(batch)
            line = (intercept, self._layers * self._decode.context_s)
            self._decode_lines[batch] = line
        return line

    @property
    def monotone(self) -> bool:
        """Every term is a fixed cost plus nonnegative rates, and the p-norm grows with both
        of its times."""
        return True

    def transfer_time(self, tokens: int) -> float:
        """Each TP shard moves its share of the KV in parallel over its own link."""
        if tokens <= 0:
            return 0.0
        return self._transfer.seconds(tokens * self._kv_bytes_per_shard)


def _keep(times: list[float], index: int, seconds: float) -> None:
    """Set ``times[index]``, first growing the list with unset slots (through the index, or to
    twice its length within ``_LISTED_TOKENS`` slots if that is more: growing costs amortized
    O(1) a slot)."""
    if index >= len(times):
        times.extend([_UNSET] * (max(index + 1, min(2 * len(times), _LISTED_TOKENS)) - len(times)))
    times[index] = seconds
