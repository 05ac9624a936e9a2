"""One configuration path: dataclasses that the CLI flags and config files both fill.

``PolicyConfig`` holds the scheduling knobs that ``tropical sim`` and ``tropical serve`` share
(``SimConfig`` and ``serve.options.ServeOptions`` extend it), so a policy is set the same way on
both. For the simulator, precedence is: dataclass defaults < the ``--cluster`` preset < a
``--config`` file (TOML or JSON) < explicit flags. Every field is a flag of the same name
(``max_batched_tokens`` → ``--max-batched-tokens``), so files and flags never drift apart.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, fields, replace
from enum import Enum
from pathlib import Path
from typing import Any, Protocol, TypeVar

import tomllib

from tropical.core.slo import SLOSpec
from tropical.sched.kv_router import OVERLAP_WEIGHT
from tropical.sched.registry import PolicyParams
from tropical.sched.rejection import AdmissionMode
from tropical.sched.slack import SlackRule
from tropical.sched.tropical import SHORTLIST, ToggleParams

Named = TypeVar("Named", bound=Enum)

PRESETS: dict[str, dict[str, Any]] = {
    "paper": {"model": "internlm2-20b", "gpu": "a100-80gb", "tp": 2, "workers": 4},
    "paper-h100": {"model": "internlm2-20b", "gpu": "h100-80gb", "tp": 2, "workers": 4},
    "small": {"model": "llama-2-7b", "gpu": "a100-80gb", "tp": 1, "workers": 4},
}


@dataclass(frozen=True)
class PolicyConfig:
    """The policy and its knobs: batch limits, and the toggle's role split, KV watermark, slack
    rule, look-ahead, demotion of doomed requests, chunked multiplexing, laxity order, Path 1's
    dispatch, online correction of predictions, roles both ways, banked slack in bursts, the
    prefill workers' batch, whether multiplexing workers spare the prompts an iteration
    finishes and how a prompt's own prefill weighs in its queue key; and, for every policy,
    which requests to refuse before any work (``admission``, see ``sched.rejection``)."""

    policy: str = "tropical"
    prefill_workers: int | None = None
    max_batched_tokens: int = 4096
    chunk_budget: int = 2048
    max_seqs: int = 256
    watermark: float = 0.9
    slack: str = "iteration"
    lookahead: int = 64
    demote_doomed: bool | None = None
    chunked_multiplex: bool = False
    laxity: bool = False
    least_loaded: bool = False
    correct_predictions: bool = False
    roles_both_ways: bool = False
    burst_multiplex: bool = False
    prefill_batch_tokens: int | None = None
    spare_finishing: bool | None = None
    shortlist: int = SHORTLIST
    placed_dispatch: bool | None = None
    size_weight: float | None = None
    prefill_piece_tokens: int | None = None
    shorter_first: bool | None = None
    iteration_cap: bool | None = None
    joining_decodes: bool | None = None
    kv_overlap_weight: float = OVERLAP_WEIGHT
    admission: str = "none"

    def policy_params(self, num_prefill: int | None = None) -> PolicyParams:
        """The policy's parameters; ``num_prefill`` (a role list's count) wins over ``prefill_workers``."""
        prefill = self.prefill_workers if num_prefill is None else num_prefill
        slack = choice(SlackRule, self.slack, "slack rule")
        toggle = ToggleParams(num_prefill=prefill, watermark=self.watermark, slack=slack,
                              lookahead=self.lookahead, demote_doomed=self.demote_doomed,
                              chunked=self.chunked_multiplex, laxity=self.laxity,
                              least_loaded=self.least_loaded, correct=self.correct_predictions,
                              flex=self.roles_both_ways, burst=self.burst_multiplex,
                              prefill_budget=self.prefill_batch_tokens,
                              spare_finishing=self.spare_finishing, shortlist=self.shortlist,
                              placed_dispatch=self.placed_dispatch, size_weight=self.size_weight,
                              prefill_piece=self.prefill_piece_tokens, shorter_first=self.shorter_first,
                              iteration_cap=self.iteration_cap, joining_decodes=self.joining_decodes)
        return PolicyParams(self.max_batched_tokens, self.chunk_budget, self.max_seqs, toggle,
                            self.kv_overlap_weight, choice(AdmissionMode, self.admission, "admission mode"))


def choice(kind: type[Named], name: str, what: str) -> Named:
    """The member of ``kind`` named ``name``; else an error naming ``what`` and the choices."""
    try:
        return kind(name)
    except ValueError:
        raise ValueError(f"unknown {what} {name!r}; choose from "
                         f"{', '.join(m.value for m in kind)}") from None


class SLOSettings(Protocol):
    """What sets a run's default SLO: SimConfig's fields, and ServeOptions' (one scale for both)."""

    @property
    def ttft_scale(self) -> float: ...

    @property
    def tpot_scale(self) -> float: ...

    @property
    def tbt_scale(self) -> float: ...

    @property
    def slo_ttft_ms(self) -> float | None: ...

    @property
    def slo_tpot_ms(self) -> float | None: ...


def slo_spec(settings: SLOSettings) -> SLOSpec:
    """The SLO of every request that names none of its own, for the simulator and for both engines
    of the server: scales of its light-load latency unless absolute ms are set, and a TBT bound of
    ``tbt_scale`` times its TPOT target."""
    return SLOSpec(settings.ttft_scale, settings.tpot_scale, settings.slo_ttft_ms, settings.slo_tpot_ms,
                   settings.tbt_scale)


@dataclass(frozen=True)
class SimConfig(PolicyConfig):
    """Everything that defines a simulated experiment."""

    trace: str = "conversation"
    limit: int | None = None
    start_s: float | None = None
    end_s: float | None = None
    arrivals: str = "spread"
    rate: float | None = None
    arrival_cv: float = 1.0
    min_input: int | None = None
    max_input: int | None = None
    min_output: int | None = None
    max_output: int | None = None
    seed: int = 0
    cluster: str = "paper"
    model: str = "internlm2-20b"
    gpu: str = "a100-80gb"
    tp: int = 2
    workers: int = 4
    memory_utilization: float = 0.9
    profile: str | None = None
    rate_scale: float = 1.0
    ttft_scale: float = 5.0
    tpot_scale: float = 5.0
    tbt_scale: float = 5.0
    slo_ttft_ms: float | None = None
    slo_tpot_ms: float | None = None
    slo_classes: str | None = None
    predictor_noise: float = 0.0
    predictor_bias: float = 0.0
    prefix_cache: bool = True
    host_kv: float = 0.0
    host_tier: str = "per-worker"

    def with_preset(self) -> SimConfig:
        if self.cluster not in PRESETS:
            raise ValueError(f"unknown cluster {self.cluster!r}; presets: {', '.join(PRESETS)}")
        return replace(self, **PRESETS[self.cluster])

    def updated(self, values: dict[str, Any], source: str) -> SimConfig:
        """A copy with ``values`` applied; unknown keys are an error naming ``source``."""
        types = {f.name: str(f.type) for f in fields(self)}
        unknown = sorted(set(values) - set(types))
        if unknown:
            raise ValueError(f"{source}: unknown setting(s) {', '.join(unknown)}; "
                             f"known: {', '.join(sorted(types))}")
        return replace(self, **{k: _checked(k, v, types[k], source) for k, v in values.items()})

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def _checked(name: str, value: Any, type_name: str, source: str) -> Any:
    """``value`` as the field's type; ints pass as floats, anything else is a clear error."""
    if value is None and "None" in type_name:
        return None
    base = type_name.split(" ")[0]
    if base == "float" and isinstance(value, int | float) and not isinstance(value, bool):
        return float(value)
    if base == "int" and isinstance(value, int) and not isinstance(value, bool):
        return value
    if base in ("str", "bool") and type(value).__name__ == base:
        return value
    raise ValueError(f"{source}: setting {name} must be {type_name}, got {value!r}")


def read_config_file(path: str | Path) -> dict[str, Any]:
    """Settings from a TOML or JSON file (a flat table of SimConfig fields)."""
    path = Path(path)
    try:
        text = path.read_text()
    except OSError as err:
        raise ValueError(f"cannot read config {path}: {err.strerror}") from None
    try:
        data = json.loads(text) if path.suffix == ".json" else tomllib.loads(text)
    except (json.JSONDecodeError, tomllib.TOMLDecodeError) as err:
        raise ValueError(f"{path}: {err}") from None
    if not isinstance(data, dict):
        raise ValueError(f"{path}: expected a table of settings")
    return {key.replace("-", "_"): value for key, value in data.items()}
