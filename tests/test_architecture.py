"""The import graph keeps the layers of docs/architecture.md: imports point down only.

Every import in the package is read with ``ast`` (module level, inside functions, and under
``TYPE_CHECKING``), so an upward import fails here however it is written. A new module must be
given its layer in ``LAYERS`` below.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

from pytest_gputrain.plugin import FEATURES

PACKAGE = Path(__file__).resolve().parent.parent / "pytest_gputrain"

# Bottom to top; a module may import its own layer and the layers below it. Keys are the names
# under pytest_gputrain ("" is the package itself).
LAYERS: tuple[tuple[str, frozenset[str]], ...] = (
    ("vocabulary", frozenset({"", "units", "jsonfile", "folders", "outputs", "scopes", "facts",
                              "findings", "severity", "options", "option_errors",
                              "diagnosis_settings", "xdist", "hookspecs", "versions",
                              "percentiles", "series", "ini_settings", "feature_plugins"})),
    ("collect", frozenset({"collect"})),
    ("engine", frozenset({"engine"})),
    ("diagnosis", frozenset({"diagnosis", "report"})),
    ("features", frozenset({"assertions", "probe", "regression", "ladder", "distributed"})),
    ("entry", frozenset({"plugin", "cli", "__main__"})),
)
# Each feature stands on the core alone: it imports no other feature.
FEATURE_OF = {"assertions": "assertions", "probe": "probe", "regression": "regression",
              "ladder": "ladder", "distributed": "distributed"}
# Cycles that exist today and are being removed elsewhere; any other cycle fails.
KNOWN_CYCLES: set[frozenset[str]] = set()
# The condition language (engine/expr/), bottom to top: a module imports only those before it.
EXPR_LAYERS = ("limits", "errors", "values", "operations", "functions", "tree", "tokens",
               "parser", "templates", "reading")


def module_names(package: Path = PACKAGE) -> dict[str, Path]:
    names = {}
    for path in sorted(package.rglob("*.py")):
        parts = list(path.relative_to(package.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        names[".".join(parts)] = path
    return names


MODULES = module_names()


def imports(source: str, modules: dict[str, Path] = MODULES, type_checking: bool = True
            ) -> Iterator[tuple[str, int]]:
    """(imported module of the package, line) for every import in ``source``.

    ``type_checking=False`` leaves out imports under ``if TYPE_CHECKING:`` (they never run).
    """

    def walk(node: ast.AST, guarded: bool) -> Iterator[tuple[str, int, bool]]:
        if (isinstance(node, ast.If) and isinstance(node.test, ast.Name)
                and node.test.id == "TYPE_CHECKING"):
            for child in node.body:
                yield from walk(child, True)
            for child in node.orelse:
                yield from walk(child, guarded)
            return
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield alias.name, node.lineno, guarded
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            for alias in node.names:
                submodule = f"{node.module}.{alias.name}"
                yield (submodule if submodule in modules else node.module), node.lineno, guarded
        for child in ast.iter_child_nodes(node):
            yield from walk(child, guarded)

    for name, line, guarded in walk(ast.parse(source), False):
        if name.split(".")[0] == "pytest_gputrain" and (type_checking or not guarded):
            yield name, line


def layer_of(module: str) -> int:
    key = module.split(".")[1] if "." in module else ""
    for index, (_, names) in enumerate(LAYERS):
        if key in names:
            return index
    raise LookupError(f"{module} has no layer: add it to LAYERS in {__file__}")


def feature_of(module: str) -> str | None:
    return FEATURE_OF.get(module.split(".")[1]) if "." in module else None


def upward_imports(module: str, source: str) -> list[str]:
    """The imports of ``module`` that break the layering, as readable lines."""
    problems = []
    mine, own_feature = layer_of(module), feature_of(module)
    for target, line in imports(source):
        theirs, their_feature = layer_of(target), feature_of(target)
        if theirs > mine:
            problems.append(f"{module}:{line} imports {target} "
                            f"({LAYERS[mine][0]} -> {LAYERS[theirs][0]})")
        elif own_feature and their_feature and own_feature != their_feature:
            problems.append(f"{module}:{line} imports {target} "
                            f"(feature {own_feature} -> feature {their_feature})")
    return problems


def import_graph(type_checking: bool) -> dict[str, set[str]]:
    return {module: {target for target, _ in imports(path.read_text(encoding="utf-8"),
                                                      type_checking=type_checking)}
            for module, path in MODULES.items()}


def cycles(graph: dict[str, set[str]]) -> list[frozenset[str]]:
    """The strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[frozenset[str]] = []

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
            component = set()
            while True:
                member = stack.pop()
                component.add(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(frozenset(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


# --------------------------------------------------------------------------------------------


def test_every_module_has_a_layer() -> None:
    for module in MODULES:
        layer_of(module)


def test_imports_point_down_only() -> None:
    problems = [problem for module, path in MODULES.items()
                for problem in upward_imports(module, path.read_text(encoding="utf-8"))]
    assert not problems, "\n".join(problems)


def test_the_engine_imports_no_feature() -> None:
    engine = [module for module in MODULES if module.startswith("pytest_gputrain.engine")]
    assert engine
    for module in engine:
        for target, line in imports(MODULES[module].read_text(encoding="utf-8")):
            assert feature_of(target) is None, f"{module}:{line} imports {target}"


@pytest.mark.parametrize("base", ["collect", "facts"])
def test_collect_and_facts_import_nothing_above_them(base: str) -> None:
    mine = layer_of(f"pytest_gputrain.{base}")
    modules = [m for m in MODULES if m.split(".")[1:2] == [base]]
    assert modules
    for module in modules:
        for target, line in imports(MODULES[module].read_text(encoding="utf-8")):
            assert layer_of(target) <= mine, f"{module}:{line} imports {target}"


def test_no_import_cycles() -> None:
    # Every import counts: lazy ones inside functions, and those under TYPE_CHECKING, which
    # never run but tie the modules together for a reader (and for the type checker) all the
    # same.
    found = set(cycles(import_graph(type_checking=True))) - KNOWN_CYCLES
    assert not found, "import cycles: " + "; ".join(" <-> ".join(sorted(c)) for c in found)


# A module a reader takes in at one sitting, a class one concern: past these, split by job.
MAX_MODULE_LINES = 600
MAX_CLASS_LINES = 300


@pytest.mark.parametrize("module", sorted(MODULES))
def test_modules_and_classes_stay_readable(module: str) -> None:
    source = MODULES[module].read_text(encoding="utf-8")
    lines = source.count("\n")
    assert lines <= MAX_MODULE_LINES, f"{module}: {lines} lines (split it by concern)"
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ClassDef):
            size = (node.end_lineno or node.lineno) - node.lineno + 1
            assert size <= MAX_CLASS_LINES, f"{module}.{node.name}: {size} lines"


def test_the_engine_has_no_import_cycle_even_counting_type_checking() -> None:
    graph = {module: {target for target in targets if target.startswith("pytest_gputrain.engine")}
             for module, targets in import_graph(type_checking=True).items()
             if module.startswith("pytest_gputrain.engine")}
    assert cycles(graph) == []


def test_the_expression_language_imports_down_only() -> None:
    package = "pytest_gputrain.engine.expr"
    inside = sorted(module.removeprefix(package + ".") for module in MODULES
                    if module.startswith(package + "."))
    assert inside == sorted(EXPR_LAYERS), f"give each module of {package} its place in EXPR_LAYERS"
    for module in EXPR_LAYERS:
        below = {f"{package}.{name}" for name in EXPR_LAYERS[:EXPR_LAYERS.index(module)]}
        for target, line in imports(MODULES[f"{package}.{module}"].read_text(encoding="utf-8")):
            if target.startswith(package):
                assert target in below, f"{package}.{module}:{line} imports {target}"


# -- every feature comes in through one door ----------------------------------------------------

# Where pytest's plugin manager is called directly: the door itself, and plugin.py registering
# the features' plugin modules (pytest_addoption).
DOOR = {("pytest_gputrain.feature_plugins", "register"),
        ("pytest_gputrain.feature_plugins", "unregister"),
        ("pytest_gputrain.plugin", "pytest_addoption")}


def _dotted(node: ast.AST) -> str:
    """``config.pluginmanager.register`` for the expression of a call's function."""
    if isinstance(node, ast.Attribute):
        return f"{_dotted(node.value)}.{node.attr}"
    return node.id if isinstance(node, ast.Name) else "?"


def _calls(tree: ast.AST) -> Iterator[tuple[str, str, ast.Call]]:
    """(the innermost function or method around it, the called name, the call)."""
    def walk(node: ast.AST, function: str) -> Iterator[tuple[str, str, ast.Call]]:
        for child in ast.iter_child_nodes(node):
            inner = child.name if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)) \
                else function
            if isinstance(child, ast.Call):
                yield inner, _dotted(child.func), child
            yield from walk(child, inner)

    yield from walk(tree, "")


def plugin_manager_calls(module: str, source: str) -> list[str]:
    """Calls of the plugin manager's register/unregister outside the door, as readable lines."""
    return [f"{module}:{call.lineno} {function}() calls {name}"
            for function, name, call in _calls(ast.parse(source))
            if name.split(".")[-2:-1] == ["pluginmanager"]
            and name.rsplit(".", 1)[-1] in ("register", "unregister")
            and (module, function) not in DOOR]


def _door_calls(source: str, function: str) -> list[tuple[str, str]]:
    """(door function, key) of each ``feature_plugins.register/unregister(config, KEY, ...)``
    made in ``function``."""
    return [(name.rsplit(".", 1)[-1], _dotted(call.args[1]))
            for inside, name, call in _calls(ast.parse(source))
            if inside == function and name.startswith("feature_plugins.") and len(call.args) > 1]


def test_only_the_door_registers_plugin_objects() -> None:
    problems = [problem for module, path in MODULES.items()
                for problem in plugin_manager_calls(module, path.read_text(encoding="utf-8"))]
    assert not problems, "\n".join(problems)


@pytest.mark.parametrize("module", [*FEATURES, "pytest_gputrain.plugin"])
def test_every_feature_and_the_diagnosis_register_one_plugin_object(module: str) -> None:
    """Registered in pytest_configure and unregistered in pytest_unconfigure through the door,
    under the feature's ``PLUGIN_KEY`` (the diagnosis's: ``options.DIAGNOSIS_KEY``)."""
    source = MODULES[module].read_text(encoding="utf-8")
    key = "options.DIAGNOSIS_KEY" if module == "pytest_gputrain.plugin" else "PLUGIN_KEY"
    assert _door_calls(source, "pytest_configure") == [("register", key)]
    assert _door_calls(source, "pytest_unconfigure") == [("unregister", key)]
    if key == "PLUGIN_KEY":
        assert re.search(r"^PLUGIN_KEY = pytest\.StashKey\[", source, re.MULTILINE), module


def test_hook_wrappers_are_new_style_and_workeroutput_is_read_in_one_place() -> None:
    for module, path in MODULES.items():
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            if isinstance(node, ast.keyword):
                assert node.arg != "hookwrapper", f"{module}:{node.value.lineno}: use wrapper=True"
            named = node.attr if isinstance(node, ast.Attribute) else getattr(node, "value", None)
            if isinstance(node, (ast.Attribute, ast.Constant)) and named == "workeroutput":
                assert module == "pytest_gputrain.xdist", (
                    f"{module}:{node.lineno}: send_to_controller / sent_by_worker (xdist.py)")


# -- the checks themselves catch what they are for ----------------------------------------------


def test_an_upward_import_inside_a_function_is_caught() -> None:
    source = ("def evaluate():\n"
              "    from pytest_gputrain.distributed.launch_facts import build_facts\n")
    assert upward_imports("pytest_gputrain.engine.evaluate", source) == [
        "pytest_gputrain.engine.evaluate:2 imports pytest_gputrain.distributed.launch_facts "
        "(engine -> features)"]


def test_a_type_checking_import_of_another_feature_is_caught() -> None:
    source = ("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
              "    from pytest_gputrain.probe.plugin import ProbePlugin\n")
    assert upward_imports("pytest_gputrain.ladder.plugin", source) == [
        "pytest_gputrain.ladder.plugin:3 imports pytest_gputrain.probe.plugin "
        "(feature ladder -> feature probe)"]


def test_a_module_without_a_layer_is_named() -> None:
    with pytest.raises(LookupError, match=r"pytest_gputrain\.newthing has no layer"):
        layer_of("pytest_gputrain.newthing")


def test_cycles_are_found() -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert cycles(graph) == [frozenset({"a", "b", "c"})]


def test_a_plugin_registered_past_the_door_is_caught() -> None:
    source = ("def pytest_configure(config):\n"
              "    config.pluginmanager.register(Tables(config), 'tables')\n")
    assert plugin_manager_calls("pytest_gputrain.ladder.plugin", source) == [
        "pytest_gputrain.ladder.plugin:2 pytest_configure() calls "
        "config.pluginmanager.register"]
    door = ("def pytest_configure(config):\n"
            "    feature_plugins.register(config, PLUGIN_KEY, Tables(config), 'tables')\n")
    assert plugin_manager_calls("pytest_gputrain.ladder.plugin", door) == []
    assert _door_calls(door, "pytest_configure") == [("register", "PLUGIN_KEY")]
