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
    table = reporting.markdown_table(["a", "b"], [[1, "x \\| y"]])
    md = reporting.report(tmp_path / "x", rows, title="T", produced="how", tables=[table],
                          figure=None)
    line = reporting.provenance_line(reporting.csv_provenance(tmp_path / "x.csv"))
    assert md.read_text() == f"# T\n\n{line}\n\nhow\n\n| a | b |\n| --- | --- |\n| 1 | x \\| y |\n"
    assert (tmp_path / "x.csv").read_text().splitlines()[1:3] == ["step,loss", "1,1.0"]
    with pytest.raises(ValueError, match="no rows"):
        reporting.report(tmp_path / "y", [], title="T", produced="", tables=[], figure=None)


def test_read_report_returns_the_tables_and_refuses_prose(tmp_path):
    path = tmp_path / "r.md"
    path.write_text("# T\n\nProvenance: now\n\nhow\n\n| a | b |\n| --- | --- |\n| 1 | x \\| y |"
                    "\n\n## more\n| c |\n| --- |\n| 2 |\n| 3 |\n\n![T](r.png)\n")
    title, produced, tables = reporting.read_report(path)
    assert (title, produced) == ("T", "how")
    assert tables == [[{"a": "1", "b": "x \\| y"}], [{"c": "2"}, {"c": "3"}]]
    for text in ("# T\n\nProvenance: now\n\nhow\n\n| a |\n| --- |\n| 1 |\n\nThe numbers agree.\n",
                 "# T\n\nProvenance: now\n\nhow\nand why\n\n| a |\n| --- |\n| 1 |\n",
                 "# T\n\nhow\n\n| a |\n| --- |\n| 1 |\n",  # no provenance
                 "T\n\nProvenance: now\n\nhow\n"):
        path.write_text(text)
        with pytest.raises(ValueError):
            reporting.read_report(path)


def test_summarise_groups_and_skips_diverged_rows():
    rows = [{"setting": "a", "seed": s, "status": "ok", "acc": 0.5 + s / 10} for s in (0, 1)]
    rows += [{"setting": "b", "seed": 0, "status": "ok", "acc": 0.9},
             {"setting": "b", "seed": 1, "status": "diverged", "acc": math.nan},
             {"setting": "c", "seed": 0, "status": "diverged", "acc": math.nan}]
    a, b, c = reporting.summarise(rows, ["setting"], ["acc"])
    assert a == {"setting": "a", "seeds": 2, "diverged": 0, "acc": pytest.approx(0.55),
                 "acc_std": pytest.approx(0.1 / math.sqrt(2))}
    assert (b["seeds"], b["diverged"], b["acc"], b["acc_std"]) == (2, 1, 0.9, 0.0)
    assert c["diverged"] == 1 and math.isnan(c["acc"])
    assert reporting.pm(a, "acc") == "55.0 ± 7.1" and reporting.pm(c, "acc") == "diverged"
    assert reporting.pm(a, "acc", 1.0, 3) == "0.550 ± 0.071"


def test_command_and_parser():
    assert reporting.command("/x/experiments/mi_bound.py", ["--quick", "--out", "a b"]) == (
        "`python experiments/mi_bound.py --quick --out 'a b'`")
    args = reporting.parser("Doc.\n\nmore", "name", quick="tiny").parse_args([])
    assert not args.quick and args.out == str(reporting.RESULTS / "name")


def test_warmup_and_late_metrics():
    # the main job warms up for 31 of its 625 steps; at least one step, and fewer than all
    assert sweep.warmup_steps(625) == 31 and sweep.warmup_steps(157) == 8
    assert sweep.warmup_steps(2) == 1 and sweep.warmup_steps(100_000) == 4960
    result = {"final_train_metrics": {"loss": 2.0, "top1": 0.5}, "tail_metrics": {"loss": 1.5},
              "linear_probe": 0.9, "knn": 0.8}
    assert sweep.late_metrics(result) == ({"loss": 1.5, "top1": 0.5}, True)
    result["final_train_metrics"]["loss"] = math.inf  # the last step blew up
    assert sweep.late_metrics(result)[1] is False
    assert sweep.late_metrics({**result, "knn": math.nan, "tail_metrics": {}})[1] is False
