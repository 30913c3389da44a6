"""curves.png's training lines: labelled as what they draw (issue 41 item 10)."""

import numpy as np

from bertkit.training.metrics_log import train_series


def test_a_short_run_draws_per_step_values_labelled_so():
    values = [float(v) for v in np.random.default_rng(0).random(60)]
    [(ys, label)] = train_series(values)  # 60 // 50 = a window of 1: no mean to draw
    assert ys == values and label == "train (per step)"


def test_a_long_run_draws_a_true_running_mean_and_says_its_window():
    values = np.random.default_rng(1).random(500)
    (raw, raw_label), (mean, label) = train_series(values)
    assert raw_label == "train (per step)" and list(raw) == list(values)
    assert label == "train (running mean of 10 steps)"
    # the reference: numpy's mean of the last 10 values (fewer at the start)
    expected = [values[max(0, i - 9): i + 1].mean() for i in range(len(values))]
    np.testing.assert_allclose(mean, expected, rtol=1e-9)
    assert np.std(mean[20:]) < 0.5 * np.std(values)  # smoother than the raw values: a mean, not a copy
