"""The suite's time budget (tests/budget.py), run on small inner suites: an over-budget test fails the session and
is named, a budget marker lets it pass, a marker without a reason is an error, and under pytest-xdist the
controller judges the workers' tests the same way."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

pytest_plugins = ["pytester"]

REPO_ROOT = Path(__file__).resolve().parents[1]
INNER_ARGS = ("-p", "tests.budget", "-p", "no:cacheprovider", "--test-budget-s", "0.5")
SLOW_TEST = "def test_slow():\n    time.sleep(0.8)\n"
QUICK_TEST = "def test_quick():\n    pass\n"


def inner_suite(pytester: pytest.Pytester, slow_marker: str = "") -> None:
    """One module: a quick test and one that sleeps 0.8 s (past the inner runs' 0.5 s budget)."""
    pytester.makepyfile(
        test_inner=f"import time\n\nimport pytest\n\n\n{QUICK_TEST}\n\n{slow_marker}\n{SLOW_TEST}",
    )


@pytest.fixture
def importable_plugin(monkeypatch: pytest.MonkeyPatch) -> None:
    """Inner subprocess runs import tests.budget from this checkout."""
    monkeypatch.setenv(
        "PYTHONPATH", os.pathsep.join(filter(None, [str(REPO_ROOT), os.environ.get("PYTHONPATH")]))
    )


def test_over_budget_test_fails_the_session_and_is_named(pytester: pytest.Pytester) -> None:
    inner_suite(pytester)
    result = pytester.runpytest(*INNER_ARGS)
    result.assert_outcomes(passed=2)  # both tests pass; the session fails on time alone
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    result.stdout.fnmatch_lines(
        [
            "*OVER BUDGET: test_inner.py::test_slow took 0.8* s, its budget is 0.5 s*",
            "*@pytest.mark.budget(seconds=N, why=*",
        ]
    )
    assert "OVER BUDGET: test_inner.py::test_quick" not in result.stdout.str()


def test_budget_marker_above_the_time_passes(pytester: pytest.Pytester) -> None:
    inner_suite(pytester, '@pytest.mark.budget(seconds=2, why="sleeps on purpose")')
    result = pytester.runpytest(*INNER_ARGS)
    result.assert_outcomes(passed=2)
    assert result.ret == pytest.ExitCode.OK
    assert "OVER BUDGET" not in result.stdout.str()


def test_budget_marker_below_the_time_still_fails(pytester: pytest.Pytester) -> None:
    inner_suite(pytester, '@pytest.mark.budget(seconds=0.6, why="sleeps on purpose")')
    result = pytester.runpytest(*INNER_ARGS)
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    result.stdout.fnmatch_lines(["*OVER BUDGET: test_inner.py::test_slow took 0.8* s, its budget is 0.6 s*"])


@pytest.mark.parametrize(
    "marker", ["@pytest.mark.budget(seconds=2)", '@pytest.mark.budget(seconds=2, why=" ")']
)
def test_budget_marker_without_why_is_an_error(pytester: pytest.Pytester, marker: str) -> None:
    inner_suite(pytester, marker)
    result = pytester.runpytest(*INNER_ARGS)
    result.assert_outcomes(passed=1, errors=1)
    result.stdout.fnmatch_lines(
        ["*test_inner.py::test_slow: @pytest.mark.budget(seconds=2) needs a non-empty why*"]
    )


def test_summary_shows_wall_time_and_slowest_tests(pytester: pytest.Pytester) -> None:
    inner_suite(pytester, '@pytest.mark.budget(seconds=2, why="sleeps on purpose")')
    result = pytester.runpytest(*INNER_ARGS)
    result.stdout.fnmatch_lines(
        [
            "*= test time budget =*",
            "suite wall time *.* s (2 tests)",
            "slowest 2 (setup + call + teardown):",
            "*0.8* s  test_inner.py::test_slow",
            "*0.0* s  test_inner.py::test_quick",
        ]
    )


def test_over_budget_under_xdist_fails_once_on_the_controller(
    pytester: pytest.Pytester, importable_plugin: None
) -> None:
    inner_suite(pytester)
    pytester.makepyfile(test_other="def test_other():\n    pass\n")
    result = pytester.runpytest_subprocess(*INNER_ARGS, "-n", "2", "--dist", "loadfile")
    result.assert_outcomes(passed=3)
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    result.stdout.fnmatch_lines(
        [
            "suite wall time *.* s (3 tests)",
            "*OVER BUDGET: test_inner.py::test_slow took 0.8* s, its budget is 0.5 s*",
        ]
    )
    assert result.stdout.str().count("OVER BUDGET") == 1
