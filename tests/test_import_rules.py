"""Which package may import which (docs/architecture.md): checked over every import statement in tailflow/.

- Prefect appears only in flows/, tasks/, driver/ and the command line's Prefect helpers, never in engines/.
- Ray appears only in engines/cluster/: the groups hand plain data to everything else.
- engines/ never imports flows/, tasks/ or the command line; of the rest of the package, only `tailflow.config`.
- tasks/ never imports flows/.
- Only flows/ itself and the command line (cli.py) import flows/: driver/, which holds the run's wiring, never does.
- tasks/, flows/ and driver/ import the simulator (engines/sim) only to plan and simulate (tasks/simulate.py,
  flows/plan.py).
- engines/ holds no module-level registry: no `global`, no module-level container that starts empty.
- No import circle anywhere in tailflow/.
Imports inside functions and under TYPE_CHECKING count too.
"""
from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "tailflow"


def imports_of(path: Path) -> list[str]:
    names = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.append(node.module)
    return names


def modules(under: str) -> dict[str, list[str]]:
    return {str(path.relative_to(PACKAGE.parent)): imports_of(path) for path in sorted((PACKAGE / under).rglob("*.py"))}


def offenders(found: dict[str, list[str]], is_bad) -> list[str]:
    return [f"{path}: {name}" for path, names in found.items() for name in names if is_bad(name)]


def roots(*names: str):
    return lambda name: any(name == root or name.startswith(root + ".") for root in names)


def test_engines_import_no_prefect_no_flows_no_tasks_and_only_the_config():
    def is_bad(name: str) -> bool:
        if roots("prefect")(name):
            return True
        return name.startswith("tailflow") and not roots("tailflow.engines", "tailflow.config")(name)

    assert offenders(modules("engines"), is_bad) == []


def test_ray_is_imported_only_in_engines_cluster():
    everything = modules(".")
    outside = {path: names for path, names in everything.items() if not path.startswith("tailflow/engines/cluster/")}
    assert offenders(outside, roots("ray")) == []


def test_tasks_do_not_import_flows():
    assert offenders(modules("tasks"), roots("tailflow.flows")) == []


def test_only_the_flows_and_the_command_line_import_flows():
    """flows/ holds only the flows; what they call (driver/, tasks/, engines/) and the rest of the package never
    reach back into it, so a flow module is imported only by its own package and by the command that starts it."""
    allowed = ("tailflow/flows/", "tailflow/cli.py")
    outside = {path: names for path, names in modules(".").items() if not path.startswith(allowed)}
    assert offenders(outside, roots("tailflow.flows")) == []


def test_only_planning_and_simulating_import_the_simulator_from_tasks_flows_and_driver():
    allowed = {"tailflow/tasks/simulate.py", "tailflow/flows/plan.py"}
    found = {path: names for path, names in {**modules("tasks"), **modules("flows"), **modules("driver")}.items()
             if path not in allowed}
    assert offenders(found, roots("tailflow.engines.sim")) == []


def module_level_registries(path: Path) -> list[str]:
    """`global` statements, and module-level names bound to an empty mutable container (a registry to fill)."""
    tree = ast.parse(path.read_text(), str(path))
    found = [f"global {', '.join(node.names)}" for node in ast.walk(tree) if isinstance(node, ast.Global)]
    for node in tree.body:
        value = node.value if isinstance(node, (ast.Assign, ast.AnnAssign)) else None
        empty = (isinstance(value, (ast.Dict, ast.List, ast.Set)) and not ast.unparse(value).strip("{}[]")) or (
            isinstance(value, ast.Call) and isinstance(value.func, ast.Name) and not value.args
            and value.func.id in ("dict", "list", "set", "defaultdict", "OrderedDict"))
        if empty:
            found.append(ast.unparse(node))
    return found


def test_engines_hold_no_module_level_registries():
    """State lives in objects handed to whoever needs it (the live watcher, the fault plan), never in a module
    read deep inside a layer."""
    found = {str(path.relative_to(PACKAGE.parent)): module_level_registries(path)
             for path in sorted((PACKAGE / "engines").rglob("*.py"))}
    assert {path: names for path, names in found.items() if names} == {}


def import_graph() -> dict[str, set[str]]:
    """Module -> the tailflow modules it imports (any import anywhere in it; importing a module imports its
    packages too, except the importer's own)."""
    names = {}
    for path in PACKAGE.rglob("*.py"):
        parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
        names[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    graph = {}
    for name, path in names.items():
        targets = set()
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            imported = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [f"{node.module}.{a.name}" for a in node.names] if isinstance(node, ast.ImportFrom) and node.module \
                and node.level == 0 else []
            for dotted in imported:
                parts = dotted.split(".")
                while parts and ".".join(parts) not in names:
                    parts.pop()
                targets |= {".".join(parts[:i]) for i in range(1, len(parts) + 1)}
        graph[name] = {t for t in targets if t != name and not name.startswith(t + ".")}
    return graph


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index, low, stack, found = {}, {}, [], []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for target in graph.get(node, ()):
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = stack[stack.index(node):]
            del stack[stack.index(node):]
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def test_no_import_circle_inside_tailflow():
    assert circles(import_graph()) == []
    assert circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]  # the check itself


def test_the_rules_see_imports_where_they_are():
    """The scanner itself: a module known to import each of these is seen to."""
    assert "ray" in imports_of(PACKAGE / "engines" / "cluster" / "trainer_group.py")
    assert "prefect" in imports_of(PACKAGE / "flows" / "iteration.py")
    assert "tailflow.flows.training" in imports_of(PACKAGE / "cli.py")  # imported inside a function
    assert any(name.startswith("tailflow.engines.cluster") for name in imports_of(PACKAGE / "engines" / "run_context.py"))
    assert module_level_registries(PACKAGE / "engines" / "faults.py") == []
    assert "tailflow.engines.reward.scoring" in import_graph()["tailflow.engines.reward.streaming"]
