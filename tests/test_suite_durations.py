"""benchmarks/suite_durations.py: a pytest durations log summed per file and per test, each
heavy test with the first sentence of its docstring."""

import pytest
import suite_durations

LOG = """\
============================= slowest durations ==============================
12.50s call     tests/test_suite_durations.py::test_the_log_is_summed_per_file_and_per_test
0.50s setup    tests/test_suite_durations.py::test_the_log_is_summed_per_file_and_per_test
3.00s call     tests/test_suite_durations.py::test_an_empty_log_says_how_to_make_one[a]
3.00s call     tests/test_suite_durations.py::test_an_empty_log_says_how_to_make_one[b c]
6.25s teardown tests/test_other.py::test_x
(12 durations < 0.2s hidden.)
17 passed, 1 warning in 21.40s (0:00:21)
"""


def test_the_log_is_summed_per_file_and_per_test():
    """Phases of one test add up; files add their tests; the heavy list is ordered, cut at
    ``heavy_s`` and names what each test proves (its docstring's first sentence)."""
    rows, passed, wall = suite_durations.parse(LOG)
    assert (len(rows), passed, wall) == (5, 17, 21.4)
    text = suite_durations.table(LOG, heavy_s=6.0, files=1)
    assert text.startswith("17 tests passed in 21.4 s wall; the listed phases sum to 25 worker")
    assert "| `tests/test_suite_durations.py` | 3 | 19.0 | 75.2% |" in text
    assert "| the other 1 files | | 6.2 | 24.8% |" in text
    heavy = [line for line in text.splitlines() if line.startswith("| `test_")]
    assert heavy == [
        "| `test_suite_durations.py::test_the_log_is_summed_per_file_and_per_test` | 13.0 | "
        "Phases of one test add up; files add their tests; the heavy list is ordered, cut at "
        "``heavy_s`` and names what each test proves (its docstring's first sentence). |",
        "| `test_other.py::test_x` | 6.2 | test_x |"]  # no such file: its name


def test_an_empty_log_says_how_to_make_one():
    with pytest.raises(SystemExit, match="--durations=0"):
        suite_durations.table("1 passed in 1.0s\n", heavy_s=5, files=10)
