"""The sweep and reporting helpers the experiment scripts share (the runs themselves are tested
through the scripts' quick modes)."""

import math

import pytest

from common import reporting, sweep


def test_tail_means_average_the_training_records_of_the_last_fraction():
    records = [{"prefix": "train", "step": s, "loss": float(s)} for s in range(10, 101, 10)]
    records.append({"prefix": "eval", "step": 100, "loss": 999.0})  # not a training record
    assert sweep.tail_means(records, 100, ["loss"], 0.2) == {"loss": 95.0}  # steps 90, 100
    assert sweep.tail_means(records, 100, ["loss"], 0.5) == {"loss": 80.0}  # 60 ... 100
    assert sweep.tail_means(records, 100, ["loss"], 0.0) == {}


def test_reporting_helpers(tmp_path):
    rows = [{"step": i, "loss": float(i)} for i in range(1, 21)]
    assert reporting.late_mean(rows, "loss", 0.1) == 19.5  # the last 2 of 20
    assert reporting.late_mean(rows[:3], "loss", 0.1) == 3.0  # at least one row
    assert reporting.mean_std([1.0, 2.0, 3.0]) == (2.0, 1.0)
    assert reporting.mean_std([4.0]) == (4.0, 0.0)
    assert all(math.isnan(v) for v in reporting.mean_std([]))
    assert reporting.accuracy_cells({"linear_probe": 0.5}) == ("0.5000", "–")
    assert reporting.markdown_table(["a", "b"], [[1, 2]]) == "| a | b |\n| --- | --- |\n| 1 | 2 |"
    md = reporting.report(tmp_path / "x", rows, title="T", body="text", figure=None)
    assert md.read_text() == "# T\n\ntext\n"
    assert (tmp_path / "x.csv").read_text().splitlines()[:2] == ["step,loss", "1,1.0"]
    with pytest.raises(ValueError, match="no rows"):
        reporting.report(tmp_path / "y", [], title="T", body="", figure=None)
