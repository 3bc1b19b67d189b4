"""gtopk.records.regime on hand-made records whose answers are worked out by hand: the
coverage of sparse, dense and skipped steps, and the least-squares trend of the test
top-1 with its standard error (and the summary fields a training run carries)."""

from __future__ import annotations

import math

import pytest

from gtopk.records.regime import accuracy_trend, coverage, summary_fields, trend
from gtopk.records.summary import summarize


def test_coverage_counts_each_iteration_once_as_update_nnz_over_m():
    m = 1000
    rows = [
        {"iter": 0, "rank": 1, "update_nnz": 10},  # both ranks apply the same update: counted once
        {"iter": 0, "rank": 0, "update_nnz": 10},
        {"iter": 1, "rank": 0, "update_nnz": 30},
        {"iter": 2, "rank": 0, "update_nnz": None, "nonfinite": "skip"},  # skipped: nothing applied
        {"iter": 3, "rank": 0, "update_nnz": None},  # no diagnostics: a dense step
    ]
    assert coverage(rows, m) == pytest.approx(0.010 + 0.030 + 0 + 1)


def test_dense_coverage_is_the_number_of_iterations():
    rows = [{"iter": i, "rank": r, "update_nnz": 500} for i in range(7) for r in range(4)]
    assert coverage(rows, 500) == 7
    with pytest.raises(ValueError, match="m > 0"):
        coverage(rows, 0)


def test_a_straight_line_has_its_slope_no_error_and_rises():
    fit = trend([0, 1, 2, 3], [1.0, 3.0, 5.0, 7.0])
    assert fit["slope"] == pytest.approx(2) and fit["se"] == pytest.approx(0) and fit["noise"] == pytest.approx(0)
    assert fit["rising"] and fit["points"] == 4


@pytest.mark.parametrize("last,slope,rising", [(5.0, 0.9, True), (4.0, 0.7, False)])
def test_slope_standard_error_and_the_95_percent_call(last, slope, rising):
    """x = 0..4, y = 1, 3, 2, 4, last. By hand: Sxx = 10; y = .., 5: Sxy = 9, slope 0.9;
    y = .., 4: Sxy = 7, slope 0.7; both leave residual sum of squares 1.9, so noise =
    sqrt(1.9 / 3) = 0.7958 and se = noise / sqrt(10) = 0.2517; t(0.975, 3) = 3.1824, so
    t * se = 0.8009: 0.9 is above it (rising), 0.7 is not."""
    fit = trend([0, 1, 2, 3, 4], [1.0, 3.0, 2.0, 4.0, last])
    assert fit["slope"] == pytest.approx(slope)
    assert fit["noise"] == pytest.approx(math.sqrt(1.9 / 3))
    assert fit["se"] == pytest.approx(math.sqrt(1.9 / 3) / math.sqrt(10))
    assert fit["t"] == pytest.approx(3.182446, abs=1e-5)
    assert fit["rising"] is rising


def test_no_trend_from_too_few_or_identical_points():
    assert trend([0, 1], [0.5, 0.6]) is None and trend([2, 2, 2], [0.1, 0.2, 0.3]) is None
    with pytest.raises(ValueError):
        trend([0, 1, 2], [1.0])


def test_accuracy_trend_takes_the_last_third_of_the_epochs_at_least_three():
    # top-1 climbs 0.1 an epoch until epoch 5, then is flat: the last third is flat
    epochs = [{"epoch": e, "test_top1": min(e, 5) * 0.1} for e in range(10)]
    fit = accuracy_trend(epochs)
    assert (fit["from_epoch"], fit["to_epoch"], fit["points"]) == (6, 9, 4)  # ceil(10 / 3) = 4
    assert fit["slope"] == pytest.approx(0) and not fit["rising"]
    short = accuracy_trend([{"epoch": e, "test_top1": 0.1 * e} for e in range(4)])
    assert (short["from_epoch"], short["points"]) == (1, 3)  # at least 3 points
    assert short["slope"] == pytest.approx(0.1) and short["rising"]
    # a resumed run records an epoch twice: its last row counts
    again = [*epochs[:9], {"epoch": 8, "test_top1": 0.9}, epochs[9]]
    assert accuracy_trend(again)["slope"] > 0
    assert accuracy_trend(epochs[:2]) is None


def test_summary_fields_and_summarize_of_a_training_run():
    rows = [
        {"iter": i, "rank": 0, "update_nnz": 27, "warmup": i < 2, "nonfinite": None, **dict.fromkeys(TIMES, 0.1)}
        for i in range(10)
    ]
    epochs = [{"epoch": e, "test_top1": 0.5 + 0.01 * e} for e in range(9)]
    fields = summary_fields(rows, 270, epochs)
    assert fields["coverage"] == pytest.approx(1.0)  # 10 steps of 27 / 270
    assert fields["top1_trend_slope"] == pytest.approx(0.01) and fields["top1_still_rising"] is True
    assert (fields["top1_trend_from_epoch"], fields["top1_trend_to_epoch"]) == (6, 8)
    meta = {"params": 270, "mode": "train"}
    summary = summarize(rows, meta, 32, epochs)
    assert summary["iterations"] == 8 and summary["coverage"] == pytest.approx(1.0)  # warm-up counts in coverage
    assert summarize(rows, meta, 32)["coverage"] == pytest.approx(1.0)
    assert "top1_still_rising" not in summarize(rows, meta, 32)
    assert "coverage" not in summarize(rows, {"params": 270, "mode": "benchmark"}, 32)
    few = summary_fields(rows, 270, epochs[:2])
    assert few["top1_still_rising"] is None and few["top1_trend_slope"] is None


TIMES = ("t_data", "t_compute", "t_compr", "t_commu", "t_update", "t_iter", "bytes_sent", "bytes_recv")
