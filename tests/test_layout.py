"""The package's floors: data flows down the wings, with no circle (the wings issue).

Walks every module's imports (module level and inside functions, read with `ast`, nothing executed)
and fails on an import from a lower wing into a higher one, or on a circle between wings.
"""

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "eagle_eval"
# the floors, lowest first: a room imports only from its own floor or below (no arrow up), and no circle
DOOR = [{"errors"}, {"units", "registry", "records", "findings", "stats"}, {"settings"}, {"models"}, {"heads"},
        {"loop"}, {"rules"}, {"profile"}, {"workload", "results", "parallel"}, {"oracle"}, {"plan", "commands"},
        {"diagnose", "servers"}, {"api", "testing"}, {"cli", "__main__"}]
LOWER = set().union(*DOOR[:9])            # the stages: below the oracle
HIGHER = set().union(*DOOR[9:])
BIGGEST_ROOM = 0.15                       # no room holds more than this share of the package's lines
# modules (not packages) `eagle-eval run` loads: the greedy path's rooms, 41 before the settings issue; + 2 since
# issue 37 (commands/effect.py: a greedy run refuses the sampling options it would ignore; models/hub: a Hugging
# Face model id as --target / --draft); + 4 since issue 38 (registry: the named things' one table; heads/kind and
# the two EAGLE-3 kinds' records, which the loader asks which kind a checkpoint is); + 2 for the kinds' wiring seam
# (heads/wired: the record a kind hands the oracle; heads/eagle3/wire: the EAGLE-3 kinds' wiring, out of oracle.py);
# + 3 since issue 40's context buckets (every report holds acceptance by context: results/context, stats/context and
# the prompt-clustered intervals of stats/clustered); + 1 since issue 39 (heads/mtp/kind: the MTP kind's record,
# asked like every kind's whether it claims a checkpoint; the rest of heads/mtp loads only with --draft mtp); + 2 for
# the block drafters' record (heads/dflash/kind and the torch-free dflash/config it detects with: the loader asks
# every kind)
GREEDY_PATH_ROOMS = 56


def _unit(module: str) -> str:
    """eagle_eval.loop.reference -> 'spec'; eagle_eval.api -> 'api'."""
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
    assert ("eagle_eval.cli", "eagle_eval.commands.ablate") in edges            # imported inside a command
    assert ("eagle_eval.loop.reference", "eagle_eval.models.target") in edges


def test_lower_wings_never_import_higher_ones():
    bad = [(a, b) for a, b in import_edges()
           if _unit(a) in LOWER and _unit(b) in HIGHER]
    assert not bad, f"imports from a lower wing into a higher one: {bad}"


def _floor(unit: str) -> int | None:
    return next((i for i, floor in enumerate(DOOR) if unit in floor), None)


def test_every_room_imports_only_from_its_floor_or_below():
    bad = [(a, b) for a, b in import_edges()
           if _floor(_unit(a)) is not None and _floor(_unit(b)) is not None and _floor(_unit(b)) > _floor(_unit(a))]
    assert not bad, f"imports from a lower floor into a higher one: {bad}"


def test_the_greedy_path_has_no_more_rooms_than_before(tmp_path):
    """`eagle-eval run` (the greedy loop over prompts) loads no more eagle_eval modules than it did before the
    settings object and the commands' rooms were introduced."""
    import subprocess
    import sys

    code = ("import sys; from click.testing import CliRunner; from eagle_eval.cli import main; "
            "r = CliRunner().invoke(main, ['run', '--limit', '1', '--max-new-tokens', '2']); assert r.exit_code == 0, r.output; "
            "import importlib.util as u; "
            "print(sum(1 for m in list(sys.modules) if m.startswith('eagle_eval') and "
            "u.find_spec(m).submodule_search_locations is None))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                         cwd=PACKAGE.parent)
    assert out.returncode == 0, out.stderr[-2000:]
    rooms = int(out.stdout.strip().splitlines()[-1])
    assert rooms <= GREEDY_PATH_ROOMS, f"`eagle-eval run` loads {rooms} modules, more than {GREEDY_PATH_ROOMS}"


def test_parallel_knows_no_model():
    """parallel/ moves records between processes; decoding comes in as a callable (its contract)."""
    bad = [(a, b) for a, b in import_edges() if _unit(a) == "parallel"
           and _unit(b) not in ("parallel", "results", "workload", "errors")]
    assert not bad, f"parallel/ imports beyond results, workload and errors: {bad}"


def test_errors_is_the_ground_floor():
    assert not [b for a, b in import_edges() if a == "eagle_eval.errors"]
    assert {b for a, b in import_edges() if a == "eagle_eval.units"} <= {"eagle_eval.errors"}


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
