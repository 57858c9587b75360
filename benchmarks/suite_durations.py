"""Where the test suite's time goes: a pytest durations log as a per-file and per-test table.

    python -m pytest -q -n 2 --durations=0 --durations-min=0.2 > suite.log
    python benchmarks/suite_durations.py suite.log [--heavy_s 5] > table.md

Reads the ``--durations`` lines (``12.34s call tests/test_x.py::test_y[param]``) and the
summary line (``N passed ... in S s``) of one run; prints, as Markdown: the run's wall time and
test count, each file's summed setup + call + teardown seconds (the top ``--files`` files) with
its test count and share, then every test of at least ``--heavy_s`` seconds with the first
sentence of its docstring (what it proves). Seconds are worker seconds: with ``-n 2`` the
wall time is about half their sum. Nothing is timed here; the numbers are the log's.
"""

from __future__ import annotations

import argparse
import ast
import collections
import pathlib
import re
import sys

ROOT = pathlib.Path(__file__).resolve().parents[1]
LINE = re.compile(r"^(\d+(?:\.\d+)?)s (setup|call|teardown)\s+(tests\S*::.+?)\s*$")
SUMMARY = re.compile(r"(\d+) passed.* in (\d+(?:\.\d+)?)s")


def parse(text: str) -> tuple[list[tuple[float, str, str]], int | None, float | None]:
    """``([(seconds, phase, test id), ...], tests passed, wall seconds)`` of a durations log."""
    rows = [(float(m[1]), m[2], m[3]) for m in map(LINE.match, text.splitlines()) if m]
    summary = SUMMARY.search(text)
    return rows, (int(summary[1]) if summary else None), (float(summary[2]) if summary else None)


def claim(test_id: str) -> str:
    """The first sentence of the test function's docstring (its test name, if it has none)."""
    path, _, name = test_id.partition("::")
    name = name.split("[", 1)[0].split("::")[-1]
    try:
        tree = ast.parse((ROOT / path).read_text())
    except OSError:
        return name
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef) and node.name == name:
            doc = " ".join((ast.get_docstring(node) or "").split())
            if doc:
                first = re.split(r"(?<=\.)\s+(?=[A-Z`])", doc, maxsplit=1)[0]
                return first if len(first) <= 200 else first[:197].rstrip() + "..."
    return name.removeprefix("test_").replace("_", " ")


def table(text: str, heavy_s: float, files: int) -> str:
    """The Markdown tables of one durations log."""
    rows, passed, wall = parse(text)
    if not rows:
        raise SystemExit("no --durations lines in the log: run pytest with --durations=0")
    per_file: collections.Counter[str] = collections.Counter()
    per_test: collections.Counter[str] = collections.Counter()
    tests_in: dict[str, set[str]] = collections.defaultdict(set)
    for seconds, _, test_id in rows:
        path = test_id.split("::", 1)[0]
        per_file[path] += seconds
        per_test[test_id] += seconds
        tests_in[path].add(test_id)
    total = sum(per_file.values())
    out = [f"{passed if passed is not None else '?'} tests passed in "
           f"{wall if wall is not None else '?'} s wall; the listed phases sum to {total:.0f} "
           "worker seconds.", "", "| file | tests listed | seconds | share |",
           "| --- | ---: | ---: | ---: |"]
    for path, seconds in per_file.most_common(files):
        out.append(f"| `{path}` | {len(tests_in[path])} | {seconds:.1f} | "
                   f"{100 * seconds / total:.1f}% |")
    rest = total - sum(s for _, s in per_file.most_common(files))
    if rest > 0:
        out.append(f"| the other {len(per_file) - files} files | | {rest:.1f} | "
                   f"{100 * rest / total:.1f}% |")
    out += ["", f"| test (>= {heavy_s:g} s) | seconds | what it proves |", "| --- | ---: | --- |"]
    for test_id, seconds in per_test.most_common():
        if seconds < heavy_s:
            break
        out.append(f"| `{test_id.removeprefix('tests/')}` | {seconds:.1f} | {claim(test_id)} |")
    return "\n".join(out) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0])
    parser.add_argument("log", type=pathlib.Path, help="pytest output with --durations=0")
    parser.add_argument("--heavy_s", type=float, default=5.0, help="list tests at least this long")
    parser.add_argument("--files", type=int, default=30, help="list this many files")
    args = parser.parse_args(argv)
    sys.stdout.write(table(args.log.read_text(), args.heavy_s, args.files))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
