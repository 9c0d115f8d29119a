"""The generated parts of the docs are current: docs/design.md's map of the package (scripts/house_map.py) and
the measurement tables (benchmarks/tables.py, from benchmarks/results/*.json), as test_settings.py checks
docs/cli.md. Plus the map's own rules: every module is on it, floors follow the imports, a circle is refused."""

import ast

import pytest
from scripts_by_path import load_script

doc_blocks = load_script("doc_blocks")
house_map = load_script("house_map")


def test_the_house_map_in_design_md_is_current():
    assert doc_blocks.stale(house_map.blocks()) == [], "docs/design.md is stale: python scripts/house_map.py"


def test_every_module_is_on_the_map_with_its_contract():
    text = house_map.house_map()
    for path in sorted(house_map.PACKAGE.rglob("*.py")):
        rel = path.relative_to(house_map.PACKAGE)
        if rel.as_posix() == "__init__.py":
            continue
        shown = f"`{rel.parent.as_posix()}/`" if path.name == "__init__.py" else f"`{rel.as_posix()}`"
        doc = ast.get_docstring(ast.parse(path.read_text()))
        assert doc, f"eagle_eval/{rel} has no docstring: its first sentence is its contract on the map"
        row = next((line for line in text.splitlines() if f"| {shown} |" in line), None)
        assert row is not None, f"{shown} is not on the map"
        assert doc.split()[0] in row, (shown, row)


def test_a_floor_is_one_above_the_highest_room_it_imports():
    def module(room, imports):
        return {"room": room, "imports": set(imports)}
    rooms = {"a": module("errors", []), "b": module("settings", ["errors"]), "c": module("cli", ["settings", "errors"]),
             "d": module("results", ["errors"])}
    floor, graph = house_map.floors(rooms)
    assert floor == {"errors": 0, "settings": 1, "results": 1, "cli": 2}
    assert graph["cli"] == {"settings", "errors"}


def test_a_circle_between_rooms_is_refused_by_name():
    rooms = {"a": {"room": "x", "imports": {"y"}}, "b": {"room": "y", "imports": {"z"}}, "c": {"room": "z", "imports": {"x"}}}
    with pytest.raises(ValueError, match="x -> y -> z -> x"):
        house_map.floors(rooms)


def test_a_block_is_replaced_only_between_its_own_markers():
    text = ("before\n<!-- generated: one (cmd) -->\nold\n<!-- end generated: one -->\nmiddle\n"
            "<!-- generated: two -->\nkept\n<!-- end generated: two -->\nafter\n")
    assert doc_blocks.names_in(text) == ["one", "two"]
    new = doc_blocks.fill(text, {"one": "new\nlines"})
    assert new == text.replace("old\n", "new\nlines\n")
    assert doc_blocks.fill(new, {"one": "new\nlines"}) == new
