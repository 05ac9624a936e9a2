"""Turn a SimConfig into an Experiment: load the trace, the model, the latency model."""

from __future__ import annotations

from tropical.calibration.store import load_profile, load_roofline
from tropical.config import SimConfig, slo_spec
from tropical.core.slo import SLOMix, SLOSpec
from tropical.sim.cluster import LatencyFactory, replicas
from tropical.sim.run import Experiment
from tropical.workload.catalog import load_slice
from tropical.workload.trace import Trace
from tropical.workload.transform import LengthBounds


def latency_factory(cfg: SimConfig) -> LatencyFactory:
    if cfg.profile is None:
        return load_roofline
    fitted = load_profile(cfg.profile)
    return lambda replica: fitted


def parse_slo_classes(text: str, seed: int, tbt_scale: float = 5.0) -> SLOMix:
    """``0.3:ttft_ms=2000:tpot_ms=80,0.7:ttft_scale=10`` → classes with shares 0.3 and 0.7."""
    classes = []
    for item in text.split(","):
        share, *settings = item.strip().split(":")
        try:
            fields = {k: float(v) for k, v in (s.split("=", 1) for s in settings)}
            fields.setdefault("tbt_scale", tbt_scale)
            classes.append((float(share), SLOSpec(**fields)))
        except (ValueError, TypeError) as err:
            raise ValueError(f"SLO class {item.strip()!r}: expected share:key=value:..., with keys "
                             f"ttft_scale, tpot_scale, ttft_ms, tpot_ms, tbt_scale ({err})") from None
    return SLOMix(tuple(classes), seed)


def worker_gpus(cfg: SimConfig) -> list[str]:
    """``--gpu a100`` means every worker; ``--gpu a100,a100,h100,h100`` names each one."""
    gpus = [g.strip() for g in cfg.gpu.split(",") if g.strip()]
    if len(gpus) == 1:
        return gpus * cfg.workers
    if len(gpus) != cfg.workers:
        raise ValueError(f"--gpu names {len(gpus)} GPUs but the cluster has {cfg.workers} workers")
    return gpus


def trace_slice(cfg: SimConfig, name: str, limit: int | None) -> Trace:
    """The first ``limit`` requests of trace ``name`` with the configured arrivals and lengths."""
    return load_slice(name, limit, cfg.arrivals, cfg.seed, rate=cfg.rate, arrival_cv=cfg.arrival_cv,
                      bounds=length_bounds(cfg))


def length_bounds(cfg: SimConfig) -> LengthBounds:
    return LengthBounds(cfg.min_input, cfg.max_input, cfg.min_output, cfg.max_output)


def experiment(cfg: SimConfig) -> Experiment:
    trace = load_slice(cfg.trace, cfg.limit, cfg.arrivals, cfg.seed, cfg.start_s, cfg.end_s,
                       rate=cfg.rate, arrival_cv=cfg.arrival_cv, bounds=length_bounds(cfg))
    if not len(trace):
        raise ValueError(f"trace {cfg.trace!r} has no requests in the selected slice "
                         "(check --limit, --start-s and --end-s)")
    cluster = replicas(cfg.cluster, cfg.model, worker_gpus(cfg), cfg.tp, latency_factory(cfg),
                       cfg.memory_utilization)
    slo = slo_spec(cfg)
    mix = parse_slo_classes(cfg.slo_classes, cfg.seed, cfg.tbt_scale) if cfg.slo_classes else None
    return Experiment(trace, cluster, cfg.policy, cfg.policy_params(), slo, cfg.rate_scale,
                      cfg.predictor_noise, cfg.seed, mix, cfg.predictor_bias,
                      cfg.prefix_cache).with_host_kv(cfg.host_kv, cfg.host_tier)
