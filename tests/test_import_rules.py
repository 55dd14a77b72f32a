"""Which package may import which (docs/architecture.md): checked over every import statement in tailflow/.

- Prefect appears only in flows/, tasks/ and the command line's Prefect helpers, never in engines/.
- Ray appears only in engines/cluster/: the groups hand plain data to everything else.
- engines/ never imports flows/, tasks/ or the command line; of the rest of the package, only `tailflow.config`.
- tasks/ never imports flows/.
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


def test_the_rules_see_imports_where_they_are():
    """The scanner itself: a module known to import each of these is seen to."""
    assert "ray" in imports_of(PACKAGE / "engines" / "cluster" / "trainer_group.py")
    assert "prefect" in imports_of(PACKAGE / "flows" / "iteration.py")
    assert any(name.startswith("tailflow.engines.cluster") for name in imports_of(PACKAGE / "engines" / "run_context.py"))
