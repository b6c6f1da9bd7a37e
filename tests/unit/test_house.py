"""The house rules of issue 34, held: no module over 800 lines, and no import circle.

A circle counts every import, those inside functions and `if TYPE_CHECKING:` blocks
included: a lazy import hides a circle from the interpreter, not from a reader.
"""

from __future__ import annotations

import subprocess

from tests.unit.test_import_contracts import (
    ROOT,
    module_imports,
    project_module_of,
    project_modules,
)

MAX_LINES = 800


def test_no_module_is_over_800_lines() -> None:
    tracked = subprocess.run(
        ["git", "ls-files", "*.py"], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout.split()
    long = {
        path: n
        for path in tracked
        if (ROOT / path).is_file()
        and (n := len((ROOT / path).read_text().splitlines())) > MAX_LINES
    }
    assert long == {}, f"over {MAX_LINES} lines; cut them where their concerns part: {long}"


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in sorted(graph.get(node, ())):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                top = stack.pop()
                on_stack.discard(top)
                component.append(top)
                if top == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def import_graph() -> dict[str, set[str]]:
    graph: dict[str, set[str]] = {}
    for module, path in project_modules().items():
        targets = {project_module_of(i.target) for i in module_imports(module, path)}
        # A package's __init__ a module passes through on its way in is no edge.
        graph[module] = {t for t in targets if t is not None and t != module} - {
            m for m in project_modules() if module.startswith(m + ".")
        }
    return graph


def test_no_two_modules_import_each_other_however_indirectly() -> None:
    assert circles(import_graph()) == []


def test_the_circle_finder_finds_a_circle() -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}, "e": {"e"}}
    assert circles(graph) == [["a", "b", "c"]]


def test_the_source_files_are_where_the_graph_looks() -> None:
    modules = project_modules()
    assert "gpud.runs.lifecycle.supervisor" in modules
    assert "gpud.runs.lifecycle.supervisor" in import_graph()["gpud.daemon"]
