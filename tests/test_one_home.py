"""Each fact has one home: checked on the source, so a copy that creeps back in fails here.

- the updates-due formula, floor((env_steps - learning_starts) x updates_per_step): pearl/schedule;
- the runtimes' lag bounds and the processes runtime's allowance: pearl/schedule;
- the placement rule (which task may run on which device): pearl/placement.py, built on each
  backend's own answer for its kind (`can_run` in kernels/<kind>/backend.py).
"""
import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE_DIRS = ("pearl", "kernels", "estimator", "platforms", "configs", "hls")


def sources():
    for folder in PACKAGE_DIRS:
        for path in sorted((ROOT / folder).rglob("*.py")):
            yield path.relative_to(ROOT).as_posix(), ast.parse(path.read_text(), str(path))


def names_in(node) -> set[str]:
    return {n.id if isinstance(n, ast.Name) else n.attr for n in ast.walk(node)
            if isinstance(n, (ast.Name, ast.Attribute))}


def updates_due_formulas(tree) -> list[int]:
    """Lines multiplying (something - learning_starts) by updates_per_step."""
    lines = []
    for node in ast.walk(tree):
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Mult):
            sides = (node.left, node.right)
            if any("learning_starts" in names_in(side) for side in sides) and \
                    any("updates_per_step" in names_in(side) for side in sides):
                lines.append(node.lineno)
    return lines


def definitions(tree, wanted: set[str]) -> list[tuple[str, int]]:
    found = []
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)) and node.name in wanted:
            found.append((node.name, node.lineno))
        elif isinstance(node, ast.Assign):
            found += [(t.id, node.lineno) for t in node.targets if isinstance(t, ast.Name) and t.id in wanted]
    return found


def test_the_updates_due_formula_lives_in_the_schedule_module():
    homes = {path: lines for path, tree in sources() if (lines := updates_due_formulas(tree))}
    assert set(homes) == {"pearl/schedule/__init__.py"}, homes


def test_lag_bounds_and_allowance_live_in_the_schedule_module():
    homes = {path: found for path, tree in sources()
             if (found := definitions(tree, {"MAX_LAG", "allowance", "rate_limit", "updates_due"}))}
    assert set(homes) == {"pearl/schedule/__init__.py"}, homes


def test_the_checker_sees_a_copy():
    copy = ast.parse("def due(a, cfg):\n    return int(max(0, a.env_steps - cfg.learning_starts) * cfg.updates_per_step)\n")
    assert updates_due_formulas(copy) == [2]
    assert definitions(ast.parse("MAX_LAG = 4\n"), {"MAX_LAG"}) == [("MAX_LAG", 1)]


def placement_homes(path: str) -> bool:
    return path == "pearl/placement.py" or (path.startswith("kernels/") and path.endswith("/backend.py"))


def message_texts(tree):
    """The string constants of a module outside its docstrings (the messages it can raise or return)."""
    docstrings = {id(node.value) for node in ast.walk(tree) if isinstance(node, ast.Expr)}
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings:
            yield node.value


@pytest.mark.parametrize("phrase", ["has no act kernel", "replay runs on", "must be the sample device",
                                    "feeds a learner on the same device"])
def test_the_placement_rule_lives_in_the_placement_module(phrase):
    homes = {path for path, tree in sources() if any(phrase in text for text in message_texts(tree))}
    assert homes and all(placement_homes(path) for path in homes), homes
