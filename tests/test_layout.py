"""The package's floors: data flows down the wings, with no circle (the wings issue).

Walks every module's imports (module level and inside functions, read with `ast`, nothing executed)
and fails on an import from a lower wing into a higher one, or on a circle between wings.
"""

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "eagle_eval"
LOWER = {"models", "speculative", "workload", "results", "parallel"}
HIGHER = {"diagnose", "servers", "api", "cli"}


def _unit(module: str) -> str:
    """eagle_eval.speculative.chain -> 'spec'; eagle_eval.api -> 'api'."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "eagle_eval"


def _module_name(path: Path) -> str:
    rel = path.relative_to(PACKAGE.parent).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def import_edges() -> list[tuple[str, str]]:
    """(importing module, imported eagle_eval module) for every import in the package."""
    edges = []
    for path in sorted(PACKAGE.rglob("*.py")):
        here = _module_name(path)
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("eagle_eval"):
                names = [f"{node.module}.{a.name}" for a in node.names]
                edges += [(here, n if (PACKAGE.parent / n.replace(".", "/")).with_suffix(".py").exists()
                           or (PACKAGE.parent / n.replace(".", "/")).is_dir() else node.module) for n in names]
            elif isinstance(node, ast.Import):
                edges += [(here, a.name) for a in node.names if a.name.startswith("eagle_eval")]
    return edges


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One circle in `graph` as a path, or None."""
    state, stack = {}, []

    def visit(node):
        state[node] = "open"
        stack.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == "open":
                return stack[stack.index(nxt):] + [nxt]
            if nxt not in state and (found := visit(nxt)):
                return found
        state[node] = "done"
        stack.pop()
        return None

    for node in sorted(graph):
        if node not in state and (found := visit(node)):
            return found
    return None


def test_the_walker_sees_imports_inside_functions():
    edges = set(import_edges())
    assert ("eagle_eval.cli", "eagle_eval.api") in edges            # imported inside a command
    assert ("eagle_eval.speculative.chain", "eagle_eval.models.capture") in edges


def test_lower_wings_never_import_higher_ones():
    bad = [(a, b) for a, b in import_edges()
           if _unit(a) in LOWER and _unit(b) in HIGHER]
    assert not bad, f"imports from a lower wing into a higher one: {bad}"


def test_parallel_knows_no_model():
    """parallel/ moves records between processes; decoding comes in as a callable (its contract)."""
    bad = [(a, b) for a, b in import_edges() if _unit(a) == "parallel"
           and _unit(b) not in ("parallel", "results", "workload", "errors")]
    assert not bad, f"parallel/ imports beyond results, workload and errors: {bad}"


def test_errors_is_the_ground_floor():
    assert not [b for a, b in import_edges() if a == "eagle_eval.errors"]


def test_no_circle_between_wings():
    graph: dict[str, set[str]] = {}
    for a, b in import_edges():
        ua, ub = _unit(a), _unit(b)
        if ua != ub and "eagle_eval" not in (ua, ub):
            graph.setdefault(ua, set()).add(ub)
    assert _cycle(graph) is None, f"a circle between wings: {' -> '.join(_cycle(graph))}"


def test_no_circle_between_modules():
    graph: dict[str, set[str]] = {}
    for a, b in import_edges():
        if a != b and not b.endswith("__init__"):
            graph.setdefault(a, set()).add(b)
    packages = {_module_name(p.parent / "__init__.py") for p in PACKAGE.rglob("__init__.py")}
    for pkg in packages:                        # a package node is only its __init__: no edges to its modules
        graph.pop(pkg, None)
    assert _cycle(graph) is None, f"a circle between modules: {' -> '.join(_cycle(graph))}"


def test_the_cycle_finder_finds_one():
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert _cycle({"a": {"b"}, "b": {"c"}}) is None


def test_scripts_benchmarks_and_tests_import_only_what_exists():
    """Every eagle_eval import in scripts/, benchmarks/ and tests/ (function level too, where an
    import runs only when a long build reaches it) names a module that exists and a name it defines
    or imports: a package move must not leave a build script that fails after an hour."""
    root = PACKAGE.parent
    missing = []
    for folder in ("scripts", "benchmarks", "tests"):
        for path in sorted((root / folder).glob("*.py")):
            for node in ast.walk(ast.parse(path.read_text(), str(path))):
                if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("eagle_eval"):
                    module = root / node.module.replace(".", "/")
                    file = module.with_suffix(".py") if module.with_suffix(".py").exists() else module / "__init__.py"
                    if not file.exists():
                        missing.append(f"{path.name}:{node.lineno} {node.module}")
                        continue
                    tree = ast.parse(file.read_text())
                    defined = {n.name for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.ClassDef))}
                    defined |= {t.id for n in ast.walk(tree) if isinstance(n, (ast.Assign, ast.AnnAssign))
                                for t in (n.targets if isinstance(n, ast.Assign) else [n.target])
                                if isinstance(t, ast.Name)}
                    defined |= {(a.asname or a.name).split(".")[0] for n in ast.walk(tree)
                                if isinstance(n, (ast.Import, ast.ImportFrom)) for a in n.names}
                    if any(a.name == "*" for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) for a in n.names):
                        continue                                      # a re-exporting shim (eagle_eval.testing)
                    for alias in node.names:
                        sub = module / alias.name
                        if alias.name not in defined and not sub.with_suffix(".py").exists() and not sub.is_dir():
                            missing.append(f"{path.name}:{node.lineno} {node.module}.{alias.name}")
    assert not missing, missing
