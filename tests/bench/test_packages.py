"""The layout of bench/: one package per benchmark with its `command` module, the shared pieces in bench/common/,
and no import cycle between modules (lazy imports inside functions count too)."""

from __future__ import annotations

import importlib
from pathlib import Path

from bench.cli import BENCHMARKS, TOOLS
from tests.test_import_rules import ROOT, imported_modules, module_of

BENCH = ROOT / "bench"


def bench_import_graph() -> dict[str, set[str]]:
    """Every bench module and the bench modules it imports (a name imported from a package counts when it is one
    of that package's modules)."""
    modules = {module_of(path): path for path in sorted(BENCH.rglob("*.py"))}
    graph = {}
    for module, path in modules.items():
        names = imported_modules(path.read_text(), module, path.name == "__init__.py")
        graph[module] = {name for name in names if name in modules and name != module}
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str]:
    """One import cycle of `graph` as the list of modules around it, or [] when there is none."""
    state: dict[str, str] = {}  # "open" while on the DFS stack, "done" after
    stack: list[str] = []

    def visit(node: str) -> list[str]:
        state[node] = "open"
        stack.append(node)
        for target in sorted(graph[node]):
            if state.get(target) == "open":
                return stack[stack.index(target) :] + [target]
            if target not in state and (cycle := visit(target)):
                return cycle
        stack.pop()
        state[node] = "done"
        return []

    for node in sorted(graph):
        if node not in state and (cycle := visit(node)):
            return cycle
    return []


def test_no_import_cycle_between_bench_modules():
    assert find_cycle(bench_import_graph()) == []


def test_find_cycle_sees_a_cycle_through_a_lazy_import():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": set()}
    assert find_cycle(graph) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) == []


def test_every_subcommand_is_a_package_with_a_command_module():
    for name in [*BENCHMARKS, *TOOLS]:
        package = name.replace("-", "_")  # make-gguf lives in bench/make_gguf/
        command = importlib.import_module(f"bench.{package}.command")
        assert callable(command.add_arguments) and callable(command.run), name
        assert Path(command.__file__).parent == BENCH / package


def test_modules_sit_in_packages_only():
    loose = sorted(p.name for p in BENCH.glob("*.py") if p.name not in ("__init__.py", "cli.py"))
    assert loose == []
