"""Measure this engine's iteration times and fit the simulator's FittedModel to them.

Each point times what a step times (batch build, forward, greedy pick) over a synthetic batch of a
known BatchShape: prefills over (new, cached), decodes over (batch, context), and mixed batches.
The coefficients come from non-negative least squares on relative error, so short decodes weigh as
much as long prefills. Transfer is measured as exporting a sequence's KV into a compact buffer
(a local gather/memcpy: the lower bound of a real link).
"""

from __future__ import annotations

import json
import statistics
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from tropical.core.latency.fitted import COMPUTE, FittedModel
from tropical.core.latency.shape import BatchShape
from tropical.engine.batch import FlatBatch, Span
from tropical.engine.kv_cache import PagedKVCache
from tropical.engine.model import LlamaModel

FIT_ERROR_KEY = "fit_error"


@dataclass(frozen=True, slots=True)
class Grid:
    """Points to measure. mixed: (prefill new, prefill cached, decode batch, decode context each)."""

    prefill_new: tuple[int, ...]
    prefill_cached: tuple[int, ...]
    decode_batch: tuple[int, ...]
    decode_context: tuple[int, ...]
    mixed: tuple[tuple[int, int, int, int], ...]
    transfer_tokens: int
    warmup: int
    repeats: int

    def blocks_needed(self, block_size: int) -> int:
        """Cache blocks the largest point holds at once."""
        def blocks(tokens: int) -> int:
            return -(-tokens // block_size)
        prefill = blocks(max(self.prefill_new) + max(self.prefill_cached))
        decode = max(self.decode_batch) * blocks(max(self.decode_context) + 1)
        mixed = max(blocks(n + c) + b * blocks(ctx + 1) for n, c, b, ctx in self.mixed)
        return max(prefill, decode, mixed, blocks(self.transfer_tokens))

    def longest(self) -> int:
        return max(max(self.prefill_new) + max(self.prefill_cached), max(self.decode_context) + 1,
                   *(max(n + c, ctx + 1) for n, c, _, ctx in self.mixed))


QUICK = Grid((8, 32, 96), (0, 64), (1, 4, 16), (16, 64), ((32, 0, 4, 32), (16, 64, 8, 16), (64, 32, 2, 64)),
             transfer_tokens=128, warmup=2, repeats=3)
FULL = Grid((16, 64, 256, 1024, 2048), (0, 512, 2048), (1, 8, 32, 128), (128, 512, 2048),
            ((256, 0, 16, 512), (512, 1024, 32, 1024), (64, 0, 64, 256), (1024, 0, 8, 2048)),
            transfer_tokens=2048, warmup=3, repeats=5)
MEDIUM = Grid((16, 64, 256, 768), (0, 256), (1, 4, 16, 32), (64, 256, 768),
              ((128, 0, 4, 256), (256, 256, 16, 512), (64, 0, 16, 128), (512, 0, 8, 768)),
              transfer_tokens=768, warmup=2, repeats=3)
GRIDS = {"quick": QUICK, "medium": MEDIUM, "full": FULL}


@dataclass(frozen=True, slots=True)
class Sample:
    """One measured point: its kind ("prefill", "decode", "mixed"), shape and median seconds."""

    kind: str
    shape: BatchShape
    seconds: float


@dataclass(frozen=True, slots=True)
class FitError:
    """Absolute percentage error of the fit over one kind of point."""

    median_pct: float
    max_pct: float


@dataclass(frozen=True, slots=True)
class ProfileResult:
    model: FittedModel
    errors: dict[str, FitError]
    samples: list[Sample]


def profile_engine(model: LlamaModel, cache: PagedKVCache, grid: Grid = QUICK) -> ProfileResult:
    """Measure ``model`` on ``cache`` (left empty afterwards) and fit a FittedModel."""
    _check_room(model, cache, grid)
    samples = [Sample(kind, _shape(spans), _time(model, cache, spans, grid))
               for kind, spans in _points(grid)]
    return fit_samples(samples, _kv_bytes_per_token(cache), *_transfer(cache, grid.transfer_tokens))


def fit_samples(samples: list[Sample], kv_bytes: float, bandwidth: float, latency: float) -> ProfileResult:
    """Fit a FittedModel to measured points (from this engine or from a server over HTTP), with
    its error on each kind of point measured."""
    fitted = _fit(samples, kv_bytes, bandwidth, latency)
    kinds = dict.fromkeys(s.kind for s in samples)
    errors = {kind: _error(fitted, [s for s in samples if s.kind == kind]) for kind in kinds}
    return ProfileResult(fitted, errors, samples)


def profile_document(result: ProfileResult) -> dict[str, Any]:
    """The FittedModel's dict plus a ``fit_error`` section (``FittedModel.from_dict`` reads past it)."""
    return {**result.model.to_dict(), FIT_ERROR_KEY: {k: asdict(e) for k, e in result.errors.items()}}


def profile_model(name: str, grid: Grid, dtype: torch.dtype = torch.float32, device: str = "cpu"
                  ) -> ProfileResult:
    """Load ``name`` and profile it on a cache just big enough for the grid."""
    from tropical.engine.loader import load_model

    loaded = load_model(name, dtype=dtype, device=device)
    cache = PagedKVCache(loaded.config, grid.blocks_needed(16), 16, dtype, device)
    return profile_engine(loaded.model, cache, grid)


def write_profile(result: ProfileResult, path: str | Path) -> None:
    Path(path).write_text(json.dumps(profile_document(result), indent=2) + "\n")


def _check_room(model: LlamaModel, cache: PagedKVCache, grid: Grid) -> None:
    if cache.used_blocks:
        raise ValueError("profiling needs an empty KV cache")
    need = grid.blocks_needed(cache.block_size)
    if need > cache.num_blocks:
        raise ValueError(f"profiling needs a KV cache of at least {need} blocks of {cache.block_size}")
    if grid.longest() > model.config.max_position_embeddings:
        raise ValueError(f"profiling needs max_position_embeddings >= {grid.longest()}")


def _points(grid: Grid) -> list[tuple[str, list[Span]]]:
    prefills = [("prefill", [_prefill_span(0, new, cached)])
                for new in grid.prefill_new for cached in grid.prefill_cached]
    decodes = [("decode", _decode_spans(batch, context))
               for batch in grid.decode_batch for context in grid.decode_context]
    mixed = [("mixed", [_prefill_span(-1, new, cached), *_decode_spans(batch, context)])
             for new, cached, batch, context in grid.mixed]
    return prefills + decodes + mixed


def _prefill_span(seq_id: int, new: int, cached: int) -> Span:
    return Span(seq_id, [i % 7 + 1 for i in range(new)], cached)


def _decode_spans(batch: int, context: int) -> list[Span]:
    return [Span(i, [1], context) for i in range(batch)]


def _shape(spans: list[Span]) -> BatchShape:
    decodes = [s.cached for s in spans if len(s.token_ids) == 1 and s.cached]
    prefills = [(len(s.token_ids), s.cached) for s in spans if len(s.token_ids) > 1 or not s.cached]
    return BatchShape.of_spans(prefills, decodes)


def _time(model: LlamaModel, cache: PagedKVCache, spans: list[Span], grid: Grid) -> float:
    """Median seconds of one step over ``spans``; the cached context is allocated, not computed."""
    times = []
    for _ in range(grid.warmup + grid.repeats):
        for span in spans:
            cache.ensure(span.seq_id, span.cached)
        start = time.perf_counter()
        model(FlatBatch.build(spans, cache), cache).argmax(-1).tolist()
        times.append(time.perf_counter() - start)
        for span in spans:
            cache.free(span.seq_id)
    return statistics.median(times[grid.warmup:])


def _kv_bytes_per_token(cache: PagedKVCache) -> float:
    layers, _, _, heads, head_dim = cache.k.shape
    return float(2 * layers * heads * head_dim * cache.k.element_size())


def _transfer(cache: PagedKVCache, tokens: int) -> tuple[float, float]:
    """(bandwidth bytes/s, latency s) from exporting 1 token and ``tokens`` tokens of KV."""
    cache.ensure("transfer", tokens)
    small = median_seconds(lambda: cache.export("transfer", 1))
    large = median_seconds(lambda: cache.export("transfer", tokens))
    cache.free("transfer")
    moved = (tokens - 1) * _kv_bytes_per_token(cache)
    return moved / max(large - small, 1e-9), small


def median_seconds(action: Any, repeats: int = 7, warmup: int = 0) -> float:
    """Median seconds of ``repeats`` calls after ``warmup`` untimed ones (first calls allocate)."""
    for _ in range(warmup):
        action()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        action()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def _features(shape: BatchShape) -> list[float]:
    """Columns in FittedModel order: prefill intercept, per token, per pair·2, decode intercept,
    per context, per seq (decodes in a mixed batch ride on the prefill's intercept)."""
    prefill = [1.0, shape.prefill_tokens, 2.0 * shape.prefill_pairs] if shape.num_prefills else [0.0] * 3
    decode_intercept = 0.0 if shape.num_prefills or not shape.decode_count else 1.0
    return [*prefill, decode_intercept, shape.decode_context, shape.decode_count]


def _fit(samples: list[Sample], kv_bytes: float, bandwidth: float, latency: float) -> FittedModel:
    a = np.array([_features(s.shape) for s in samples])
    seconds = np.array([s.seconds for s in samples])
    coeffs = nnls(a / seconds[:, None], np.ones(len(samples)))
    compute = dict(zip(COMPUTE, map(float, coeffs), strict=True))
    return FittedModel(**compute, kv_bytes_per_token=kv_bytes, transfer_bandwidth=bandwidth,
                       transfer_latency=latency)


def nnls(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """argmin ||a x - b|| with x >= 0 (Lawson-Hanson), on unit-norm columns for conditioning."""
    norms = np.linalg.norm(a, axis=0)
    norms[norms == 0] = 1.0
    a = a / norms
    n = a.shape[1]
    x, passive = np.zeros(n), np.zeros(n, dtype=bool)
    for _ in range(3 * n):
        gradient = a.T @ (b - a @ x)
        if not (candidates := ~passive & (gradient > 1e-10)).any():
            break
        passive[np.argmax(np.where(candidates, gradient, -np.inf))] = True
        x = _inner_loop(a, b, x, passive)
    return x / norms


def _inner_loop(a: np.ndarray, b: np.ndarray, x: np.ndarray, passive: np.ndarray) -> np.ndarray:
    """Solve on the passive set, stepping back toward feasibility while any coefficient goes negative."""
    while True:
        z = np.zeros_like(x)
        z[passive] = np.linalg.lstsq(a[:, passive], b, rcond=None)[0]
        if (z[passive] > 0).all():
            return z
        bad = passive & (z <= 0)
        alpha = np.min(x[bad] / (x[bad] - z[bad]))
        x = x + alpha * (z - x)
        passive &= x > 1e-12
        x[~passive] = 0.0


def _error(model: FittedModel, samples: list[Sample]) -> FitError:
    pct = [100 * abs(model.iteration_time(s.shape) - s.seconds) / s.seconds for s in samples]
    return FitError(float(np.median(pct)), float(max(pct)))
