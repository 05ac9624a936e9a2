"""An SLO is a value: equal targets are equal and hash alike (it writes its constructor and
hash so that mypyc compiles them, where the ones ``dataclass`` generates would run as Python)."""

from __future__ import annotations

import math

import pytest

from tests.factories import linear_model
from tropical.core.slo import SLO, SLOSpec


def test_equal_slos_are_equal_and_hash_alike():
    a, b = SLO(0.5, 0.1), SLO(ttft=0.5, tpot=0.1, tbt=math.inf)
    assert a == b and hash(a) == hash(b) and len({a, b}) == 1
    assert SLO(0.5, 0.1, 0.2) != a and len({a, SLO(0.5, 0.1, 0.2)}) == 2


def test_a_spec_resolves_to_an_slo_of_its_scales():
    spec = SLOSpec(ttft_ms=200.0, tpot_ms=50.0, tbt_scale=3.0)
    slo = spec.resolve(1_000, linear_model())
    assert slo == SLO(0.2, 0.05, pytest.approx(0.15))
