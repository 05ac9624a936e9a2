import os
import subprocess
import sys

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tests.factories import linear_model
from tropical.core.latency.iterations import decode_time
from tropical.core.latency.noisy import NoisyModel
from tropical.core.latency.shape import BatchShape


@given(st.integers(1, 20000), st.integers(0, 20000), st.integers(0, 64))
def test_errors_stay_within_the_bound_and_repeat(new, cached, decodes):
    truth = linear_model()
    noisy = NoisyModel(truth, 0.25, seed=7)
    shape = BatchShape.of_spans([(new, cached)], [1000] * decodes)
    ratio = noisy.iteration_time(shape) / truth.iteration_time(shape)
    assert 0.75 <= ratio <= 1.25
    assert noisy.iteration_time(shape) == NoisyModel(truth, 0.25, seed=7).iteration_time(shape)


def test_noise_actually_moves_predictions():
    truth = linear_model()
    noisy = NoisyModel(truth, 0.1, seed=1)
    shapes = [BatchShape.prefill(n) for n in range(100, 200)]
    ratios = {round(noisy.iteration_time(s) / truth.iteration_time(s), 6) for s in shapes}
    assert len(ratios) > 50 and min(ratios) < 0.97 and max(ratios) > 1.03


def test_decode_line_stays_a_line():
    """One error per batch size scales the whole line, so it stays the truth's line times a
    bounded factor at every context; ``iteration_time`` draws an error per shape instead."""
    truth = linear_model()
    noisy = NoisyModel(truth, 0.25, seed=3)
    shapes = [BatchShape.decode(8, c) for c in (100, 5000, 40_000)]
    line = {round(decode_time(noisy, 8, s.decode_context) / truth.iteration_time(s), 9) for s in shapes}
    priced = {round(noisy.iteration_time(s) / truth.iteration_time(s), 9) for s in shapes}
    assert len(line) == 1 and 0.75 <= min(line) <= 1.25 and line != {1.0}
    assert len(priced) == 3 and not priced & line  # the line is not priced shape by shape


def test_noise_out_of_range_is_refused():
    with pytest.raises(ValueError, match="noise"):
        NoisyModel(linear_model(), 1.5)


def test_every_process_gets_the_same_errors():
    """Strings' hashes are salted per process; the errors' keys must not hold any."""
    code = ("from tests.factories import linear_model\n"
            "from tropical.core.latency.noisy import NoisyModel\n"
            "from tropical.core.latency.shape import BatchShape\n"
            "m = NoisyModel(linear_model(), 0.25, seed=5)\n"
            "print(m.decode_line(8), m.transfer_time(100), m.iteration_time(BatchShape.prefill(300)))")
    outs = {subprocess.run([sys.executable, "-c", code], env={**os.environ, "PYTHONHASHSEED": seed},
                           capture_output=True, text=True, check=True).stdout for seed in ("1", "2")}
    assert len(outs) == 1
