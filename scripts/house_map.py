"""docs/design.md's map of the package, drawn from the code: every module's contract and the floors the imports make.

    python scripts/house_map.py            # rewrites the map in docs/design.md
    python scripts/house_map.py --check    # exit 1 if it is stale (tests/test_docs_generated.py)

Nothing is imported or executed: each file is read with `ast`. A room is a top-level module or package of
eagle_eval; its floor is 0 when it imports no other room, else one above the highest room it imports (so the
floors are what the imports draw, whatever the folders are called, and a move needs only a re-run). Each
module shows the first sentence of its docstring (its contract); a package the first sentence of its
`__init__`'s. A circle between rooms has no floors: the map refuses it, naming the circle
(tests/test_layout.py fails on it too).
"""

from __future__ import annotations

import ast
import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from doc_blocks import REPO, main  # noqa: E402

PACKAGE = REPO / "eagle_eval"
COMMAND = "python scripts/house_map.py"


def module_name(path: Path) -> str:
    """eagle_eval/heads/io.py -> 'eagle_eval.heads.io'; a package's __init__ -> the package."""
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def room_of(module: str) -> str:
    """'eagle_eval.heads.io' -> 'models'; 'eagle_eval' -> ''."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else ""


def imported_rooms(tree: ast.AST) -> set[str]:
    """The rooms an eagle_eval module imports (at module level or inside functions)."""
    rooms = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "eagle_eval":
            rooms |= {a.name for a in node.names} if node.module == "eagle_eval" else {room_of(node.module)}
        elif isinstance(node, ast.Import):
            rooms |= {room_of(a.name) for a in node.names if a.name.startswith("eagle_eval.")}
    return rooms


def contract(doc: str | None) -> str:
    """The first sentence of a docstring's first paragraph, on one line ('' without a docstring)."""
    para = " ".join((doc or "").strip().split("\n\n")[0].split())
    m = re.search(r"(?<!e\.g)(?<!i\.e)(?<!\bvs)[.!?](?=\s+[A-Z`(])", para)
    return para[: m.end()] if m else para


def read_package() -> dict[str, dict]:
    """{module name: {"path", "room", "contract", "imports"}} for every module of the package."""
    out = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        tree = ast.parse(path.read_text(), str(path))
        name = module_name(path)
        out[name] = {"path": path.relative_to(PACKAGE), "room": room_of(name), "package": path.name == "__init__.py",
                     "contract": contract(ast.get_docstring(tree)), "imports": imported_rooms(tree)}
    return out


def floors(modules: dict[str, dict]) -> tuple[dict[str, int], dict[str, set[str]]]:
    """Each room's floor, and the rooms each room imports; ValueError naming a circle."""
    graph: dict[str, set[str]] = {}
    for m in modules.values():
        if m["room"]:
            graph.setdefault(m["room"], set()).update(r for r in m["imports"] if r and r != m["room"])
    floor: dict[str, int] = {}

    def visit(room: str, path: tuple[str, ...]) -> int:
        if room in path:
            raise ValueError("a circle between rooms has no floors: " + " -> ".join(path[path.index(room):] + (room,)))
        if room not in floor:
            floor[room] = 1 + max((visit(r, path + (room,)) for r in sorted(graph.get(room, ()))), default=-1)
        return floor[room]

    for room in sorted(graph):
        visit(room, ())
    return floor, graph


def _shown(path: Path) -> str:
    return f"`{path.parent.as_posix()}/`" if path.name == "__init__.py" else f"`{path.as_posix()}`"


def house_map(modules: dict[str, dict] | None = None) -> str:
    """The map: one table, highest floor first, a room's modules under it."""
    modules = read_package() if modules is None else modules
    floor, graph = floors(modules)
    lines = ["| floor | room | contract (its docstring's first sentence) | imports from |", "|---|---|---|---|"]
    for room in sorted(floor, key=lambda r: (-floor[r], r)):
        own = sorted((m for m in modules.values() if m["room"] == room),
                     key=lambda m: (m["path"].parent.parts, not m["package"], m["path"].name))
        for i, m in enumerate(own):
            imports = ", ".join(sorted(graph[room])) if i == 0 else ""
            where = str(floor[room]) if i == 0 else ""
            text = m["contract"].replace("|", "\\|") or "(no docstring)"
            lines.append(f"| {where} | {_shown(m['path'])} | {text} | {imports} |")
    return "\n".join(lines)


def blocks() -> dict[str, str]:
    return {"house": house_map()}


if __name__ == "__main__":
    sys.exit(main(blocks(), sys.argv[1:], COMMAND))
