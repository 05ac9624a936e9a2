import pytest

from tropical.core.gaps import GapHistogram, bucket_of, middle


def test_a_run_counts_each_iteration_in_its_own_bucket():
    series, single = GapHistogram(), GapHistogram()
    series.add_series(0.01, 0.002, 500, weight=3)
    for j in range(500):
        single.add(0.01 + 0.002 * j, 3)
    assert series.counts == single.counts
    assert series.mean == pytest.approx(single.mean)


def test_percentiles_land_within_a_bucket_of_the_exact_value():
    gaps = GapHistogram()
    for j in range(1, 1001):
        gaps.add(j / 1000)
    assert gaps.percentile(50) == pytest.approx(0.5, rel=0.07)
    assert gaps.percentile(99) == pytest.approx(0.99, rel=0.07)
    assert gaps.mean == pytest.approx(0.5005)


def test_merge_adds_counts_and_empty_is_nan():
    a, b = GapHistogram(), GapHistogram()
    a.add(0.1)
    b.add(2.0, 3)
    merged = GapHistogram.merged([a, b])
    assert merged.count == 4 and merged.percentile(50) == middle(bucket_of(2.0))
    assert GapHistogram().percentile(50) != GapHistogram().percentile(50)
