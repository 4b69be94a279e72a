"""A standing time budget for the suite: each test's setup + call + teardown must stay under one limit, or under the
`budget` marker it carries, else the session fails; the summary shows the suite's wall time and its slowest tests.

Without it a test grows from 5 s to 90 s one commit at a time and nobody notices until `make test` takes an hour.
Under pytest-xdist the timing happens on the controller, from the phase reports the workers send up: one report per
phase reaches `pytest_runtest_logreport` there, so a test is counted once. Workers only attach a test's own budget
to its reports (the controller collects no items, so it cannot read markers).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import pytest

BUDGET_S = 30.0  # per test, setup + call + teardown; raise it for one test with the marker, not here
NUM_SLOWEST = 10
BUDGET_PROPERTY = (
    "test_budget_s"  # the user property that carries a marker's seconds from worker to controller
)


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--test-budget-s",
        type=float,
        default=BUDGET_S,
        help=f"fail the session when a test without a budget marker takes longer than this (default {BUDGET_S} s)",
    )


def pytest_configure(config: pytest.Config) -> None:
    """Time the tests in the process that sees every report: the controller under xdist, else the only one."""
    if not hasattr(config, "workerinput"):
        config.pluginmanager.register(
            BudgetRecorder(config.getoption("test_budget_s")), "test-budget-recorder"
        )


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    """A marker's budget rides on the test's reports; a marker without seconds or without a reason is an error of
    that test (an unexplained exemption is how budgets erode)."""
    marker = item.get_closest_marker("budget")
    if marker is None:
        return
    seconds, why = marker.kwargs.get("seconds"), marker.kwargs.get("why")
    if marker.args or not isinstance(seconds, (int, float)) or seconds <= 0:
        pytest.fail(f"{item.nodeid}: write @pytest.mark.budget(seconds=N, why=...) with N > 0, got {marker}")
    if not isinstance(why, str) or not why.strip():
        pytest.fail(
            f"{item.nodeid}: @pytest.mark.budget(seconds={seconds}) needs a non-empty why=... (what is slow)"
        )
    item.user_properties.append((BUDGET_PROPERTY, float(seconds)))


@dataclass(eq=False)  # a plugin must hash by identity (pluggy keeps plugins in sets)
class BudgetRecorder:
    """Sums each test's phase durations as reports arrive, and judges them against the budgets at the end."""

    default_budget_s: float
    started_at: float = field(default_factory=time.monotonic)
    nodeid_to_seconds: dict[str, float] = field(default_factory=dict)
    nodeid_to_budget_s: dict[str, float] = field(default_factory=dict)
    over_budget: list[tuple[str, float, float]] = field(default_factory=list)  # (nodeid, seconds, budget)

    def pytest_sessionstart(self, session: pytest.Session) -> None:
        self.started_at = time.monotonic()

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        self.nodeid_to_seconds[report.nodeid] = (
            self.nodeid_to_seconds.get(report.nodeid, 0.0) + report.duration
        )
        for name, value in report.user_properties:
            if name == BUDGET_PROPERTY:
                self.nodeid_to_budget_s[report.nodeid] = value

    def budget_s(self, nodeid: str) -> float:
        return self.nodeid_to_budget_s.get(nodeid, self.default_budget_s)

    @pytest.hookimpl(wrapper=True)
    def pytest_sessionfinish(self, session: pytest.Session):
        """Fail an otherwise passing session. pytest returns `session.exitstatus` as it stands after this hook, and
        xdist's own sessionfinish leaves it alone; wrapping makes sure every other implementation ran first."""
        result = yield
        self.over_budget = [
            (nodeid, seconds, self.budget_s(nodeid))
            for nodeid, seconds in self.nodeid_to_seconds.items()
            if seconds > self.budget_s(nodeid)
        ]
        if self.over_budget and session.exitstatus == pytest.ExitCode.OK:
            session.exitstatus = pytest.ExitCode.TESTS_FAILED
        return result

    def pytest_terminal_summary(self, terminalreporter) -> None:
        write = terminalreporter.write_line
        terminalreporter.write_sep("=", "test time budget")
        num_tests = len(self.nodeid_to_seconds)
        plural = "" if num_tests == 1 else "s"
        write(f"suite wall time {time.monotonic() - self.started_at:.1f} s ({num_tests} test{plural})")
        slowest = sorted(self.nodeid_to_seconds.items(), key=lambda item: item[1], reverse=True)[:NUM_SLOWEST]
        if slowest:
            write(f"slowest {len(slowest)} (setup + call + teardown):")
        for nodeid, seconds in slowest:
            write(f"  {seconds:8.2f} s  {nodeid}")
        for nodeid, seconds, budget in self.over_budget:
            write(
                f"OVER BUDGET: {nodeid} took {seconds:.2f} s, its budget is {budget:g} s", red=True, bold=True
            )
        if self.over_budget:
            write(
                'make it faster, or mark it @pytest.mark.budget(seconds=N, why="what makes it slow") '
                f"(the session fails while a test is over budget; the limit without a marker is --test-budget-s={self.default_budget_s:g})",
                red=True,
            )
