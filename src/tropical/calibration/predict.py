"""The roofline's per-op predictions for profile rows: what the fit minimises and the report shows.

Every prediction goes through the op classes of ``core.latency.roofline``, so the factors are
fitted on exactly the formulas the simulator prices iterations with.
"""

from __future__ import annotations

import numpy as np

from tropical.calibration.vidur import AttentionProfile, LinkProfile, OpProfile
from tropical.core.latency.roofline import (
    DecodeAttention,
    Efficiency,
    Gemm,
    Linear,
    PrefillAttention,
)
from tropical.core.specs import HardwareSpec

GEMM_OPS = ("attn_pre_proj", "attn_post_proj", "mlp_up_proj", "mlp_down_proj")
STREAM_OPS = {"input_layernorm": "norm", "post_attention_layernorm": "norm", "attn_rope": "rope",
              "mlp_act": "activation", "add": "residual"}


def gemm(eff: Efficiency, gpu: HardwareSpec, profile: OpProfile, op: str) -> np.ndarray:
    k, out = profile.shard.gemm_dims()[op]
    return Gemm.build(eff.gemm, gpu, k, out, profile.shard.dtype_bytes).seconds(profile.tokens)


def stream(eff: Efficiency, gpu: HardwareSpec, profile: OpProfile, op: str) -> np.ndarray:
    name = STREAM_OPS[op]
    nbytes = profile.shard.stream_bytes()[name]
    return Linear.stream(getattr(eff, name), gpu.hbm_bandwidth, nbytes).seconds(profile.tokens)


def mlp_op(eff: Efficiency, gpu: HardwareSpec, profile: OpProfile, op: str) -> np.ndarray:
    """Any mlp.csv column."""
    return gemm(eff, gpu, profile, op) if op in GEMM_OPS else stream(eff, gpu, profile, op)


def prefill(eff: Efficiency, gpu: HardwareSpec, profile: AttentionProfile) -> np.ndarray:
    """Row by row: ``PrefillAttention`` takes floats (the simulator prices it at nearly every
    prediction), and its profiles hold a few rows each."""
    op = PrefillAttention.build(eff, gpu, profile.shard)
    rows = zip(profile.prefill_tokens.tolist(), profile.prefill_pairs.tolist(),
               profile.prefill_cached.tolist(), strict=True)
    return np.array([op.seconds(tokens, pairs, cached) for tokens, pairs, cached in rows])


def decode(eff: Efficiency, gpu: HardwareSpec, profile: AttentionProfile) -> np.ndarray:
    op = DecodeAttention.build(eff, gpu, profile.shard)
    return op.seconds(profile.decode_batch, profile.decode_context)


def all_reduce(eff: Efficiency, gpu: HardwareSpec, profile: LinkProfile) -> np.ndarray:
    return Linear.all_reduce(eff.all_reduce, gpu, profile.workers).seconds(profile.nbytes)


def send_recv(eff: Efficiency, gpu: HardwareSpec, profile: LinkProfile) -> np.ndarray:
    return Linear.copy(eff.transfer, gpu).seconds(profile.nbytes)


def ape(predicted: np.ndarray, measured: np.ndarray) -> np.ndarray:
    """Absolute percentage error of each row, as a fraction."""
    return np.abs(predicted / measured - 1.0)
