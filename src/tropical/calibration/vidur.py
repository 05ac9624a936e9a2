"""Read Vidur's measured per-op profiles (CSV) into arrays that the fit evaluates in one go.

Layout and column meanings: ../shared/data/profiles/vidur/SOURCE.md. All times there are
milliseconds of one op, one layer, one GPU (one tensor-parallel shard); here they become seconds.
"""

from __future__ import annotations

import csv
from collections import defaultdict
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from tropical.core.latency.roofline import Shard
from tropical.core.latency.shape import attention_pairs
from tropical.core.specs import HardwareSpec, ModelSpec, hardware

MLP_OPS = ("input_layernorm", "attn_pre_proj", "attn_rope", "attn_post_proj",
           "post_attention_layernorm", "mlp_up_proj", "mlp_act", "mlp_down_proj", "add")
NETWORK_DIRS = {"a100-80gb": "a100_dgx", "h100-80gb": "h100_dgx"}
ATTENTION_FILE = Path("data/profiling/a100/attention.csv")
EXCERPTS_FILE = Path("attention_excerpts_a100.csv")
MS = 1e-3


@dataclass(frozen=True)
class OpProfile:
    """The mlp.csv rows of one model at one TP degree: seconds per op column, by token count."""

    model: str
    tp: int
    shard: Shard
    tokens: np.ndarray
    seconds: dict[str, np.ndarray]


@dataclass(frozen=True)
class AttentionProfile:
    """Attention kernels of one model, TP degree and backend; prefill and decode rows apart."""

    source: str
    backend: str
    shard: Shard
    prefill_tokens: np.ndarray
    prefill_pairs: np.ndarray
    prefill_cached: np.ndarray
    prefill_seconds: np.ndarray
    decode_batch: np.ndarray
    decode_context: np.ndarray
    decode_seconds: np.ndarray


@dataclass(frozen=True)
class LinkProfile:
    """One collective on ``workers`` GPUs of one node: seconds by buffer bytes."""

    kind: str
    workers: int
    nbytes: np.ndarray
    seconds: np.ndarray


@dataclass
class GpuProfiles:
    """Everything measured on one GPU kind."""

    gpu: HardwareSpec
    ops: list[OpProfile] = field(default_factory=list)
    attention: list[AttentionProfile] = field(default_factory=list)
    all_reduce: list[LinkProfile] = field(default_factory=list)
    send_recv: list[LinkProfile] = field(default_factory=list)


def load_profiles(vidur_dir: Path) -> dict[str, GpuProfiles]:
    """All profiles under ``vidur_dir``, keyed by hardware name ('a100-80gb', 'h100-80gb')."""
    compute = vidur_dir / "data" / "profiling" / "compute"
    if not compute.is_dir():
        raise ValueError(f"{vidur_dir} holds no Vidur profiles (missing {compute})")
    profiles: dict[str, GpuProfiles] = {}
    for gpu_dir in sorted(p for p in compute.iterdir() if p.is_dir()):
        gpu = hardware(gpu_dir.name)
        found = GpuProfiles(gpu)
        for path in sorted(gpu_dir.glob("*/*/mlp.csv")):
            found.ops.extend(read_mlp(path))
        network = vidur_dir / "data" / "profiling" / "network" / NETWORK_DIRS[gpu.name]
        found.all_reduce = read_links(network / "all_reduce.csv", "all_reduce", intra_node_of=None)
        found.send_recv = read_links(network / "send_recv.csv", "send_recv", intra_node_of=2)
        profiles[gpu.name] = found
    if "a100-80gb" in profiles:
        profiles["a100-80gb"].attention = read_attention(vidur_dir)
    return profiles


def _rows(path: Path) -> Iterator[dict[str, str]]:
    try:
        with path.open(newline="") as handle:
            yield from csv.DictReader(handle)
    except FileNotFoundError:
        raise ValueError(f"missing profile {path}") from None


def _spec(name: str, hidden: int, q_heads: int, kv_heads: int, intermediate: int,
          vocab: int) -> ModelSpec:
    """One layer of the profiled model; layer count and context do not enter per-op times."""
    return ModelSpec(name, num_layers=1, hidden=hidden, num_q_heads=q_heads, num_kv_heads=kv_heads,
                     head_dim=hidden // q_heads, intermediate=intermediate, vocab=vocab,
                     max_context=4096)


def read_mlp(path: Path) -> list[OpProfile]:
    """One OpProfile per TP degree of an mlp.csv; the model name is its directory."""
    by_tp: dict[int, list[dict[str, str]]] = defaultdict(list)
    for row in _rows(path):
        by_tp[int(row["num_tensor_parallel_workers"])].append(row)
    profiles = []
    for tp, rows in sorted(by_tp.items()):
        first = rows[0]
        spec = _spec(path.parent.name, int(first["n_embd"]), int(first["n_head"]),
                     int(first["n_kv_head"]), int(first["n_expanded_embd"]),
                     int(first["vocab_size"]))
        seconds = {op: np.array([float(r[f"time_stats.{op}.median"]) * MS for r in rows])
                   for op in MLP_OPS}
        tokens = np.array([float(r["num_tokens"]) for r in rows])
        profiles.append(OpProfile(spec.name, tp, Shard.of(spec, tp), tokens, seconds))
    return profiles


def _attention_shard(hidden: int, q_heads: int, kv_heads: int, tp: int) -> Shard:
    """Attention rows say nothing of the MLP or vocabulary; those widths stay zero."""
    return Shard(hidden, q_heads // tp, max(kv_heads // tp, 1), hidden // q_heads, 0, 0, 2)


def _attention_profile(source: str, backend: str, shard: Shard,
                       rows: list[tuple[bool, int, int, int, float]]) -> AttentionProfile:
    """Rows are (is_prefill, batch, new tokens, cached tokens, seconds)."""
    pre = [r for r in rows if r[0]]
    dec = [r for r in rows if not r[0]]
    return AttentionProfile(
        source, backend, shard,
        prefill_tokens=np.array([float(r[2]) for r in pre]),
        prefill_pairs=np.array([float(attention_pairs(r[2], r[3])) for r in pre]),
        prefill_cached=np.array([float(r[3]) for r in pre]),
        prefill_seconds=np.array([r[4] for r in pre]),
        decode_batch=np.array([float(r[1]) for r in dec]),
        decode_context=np.array([float(r[1] * r[3]) for r in dec]),
        decode_seconds=np.array([r[4] for r in dec]))


def read_attention(vidur_dir: Path) -> list[AttentionProfile]:
    """A100 attention: Llama-2-70B TP2 (attention.csv) and the per-model excerpt rows."""
    main = [(r["is_prefill"] == "True", int(r["batch_size"]), int(r["prefill_chunk_size"]),
             int(r["kv_cache_size"]), _attention_seconds(r["time_stats.attn_prefill.median"],
                                                         r["time_stats.attn_decode.median"]))
            for r in _rows(vidur_dir / ATTENTION_FILE)]
    profiles = [_attention_profile("Llama-2-70B tp2", "FLASH_ATTENTION",
                                   _attention_shard(8192, 64, 8, 2), main)]
    groups: dict[tuple[str, str, int, int, int, int], list] = defaultdict(list)
    for r in _rows(vidur_dir / EXCERPTS_FILE):
        key = (r["model"].split("/")[-1], r["attention_backend"], int(r["n_embd"]),
               int(r["n_q_head"]), int(r["n_kv_head"]), int(r["num_tensor_parallel_workers"]))
        groups[key].append((r["is_prefill"] == "True", int(r["batch_size"]),
                            int(r["prefill_chunk_size"]), int(r["kv_cache_size"]),
                            _attention_seconds(r["attn_prefill_median_ms"],
                                               r["attn_decode_median_ms"])))
    for (model, backend, hidden, q, kv, tp), rows in sorted(groups.items()):
        profiles.append(_attention_profile(f"{model} tp{tp}", backend,
                                           _attention_shard(hidden, q, kv, tp), rows))
    return profiles


def _attention_seconds(prefill_ms: str, decode_ms: str) -> float:
    """A row fills exactly one of the two columns."""
    return float(prefill_ms or decode_ms) * MS


def read_links(path: Path, kind: str, intra_node_of: int | None) -> list[LinkProfile]:
    """Single-node rows: all GPUs of the collective on one node (Vidur's TP all-reduce rows),
    or, for send_recv, the pair on one node (``devices_per_node == intra_node_of``)."""
    by_workers: dict[int, list[tuple[float, float]]] = defaultdict(list)
    for r in _rows(path):
        workers, per_node = int(r["num_workers"]), int(r["devices_per_node"])
        if per_node == (intra_node_of or workers):
            by_workers[workers].append((float(r["size"]), float(r[f"time_stats.{kind}.median"]) * MS))
    return [LinkProfile(kind, workers, np.array([s for s, _ in rows]), np.array([t for _, t in rows]))
            for workers, rows in sorted(by_workers.items())]
