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


# -- the measurement tables (benchmarks/tables.py) -----------------------------------------------------------

import json  # noqa: E402
import re  # noqa: E402
import sys  # noqa: E402

sys.path.insert(0, str(doc_blocks.REPO / "benchmarks"))
import tables  # noqa: E402

RESULTS = doc_blocks.REPO / "benchmarks" / "results"
# a figure with a unit of time, size, speed or ratio: what the README must not quote by hand
MEASURED = re.compile(r"(?<![\w.])\d[\d,]*(\.\d+)?\s?(x|ms|s|GB|GiB|MB|TB|tokens/s|%|minutes|min)(?![\w/])")


def _outside_blocks(text: str) -> str:
    return re.sub(r"```.*?```", "", doc_blocks.BLOCK.sub("", text), flags=re.S)


def test_the_measurement_tables_in_the_docs_are_current():
    assert doc_blocks.stale(tables.blocks()) == [], "a table is stale: python benchmarks/tables.py"


def test_every_results_file_says_how_and_when_it_was_made():
    for path in sorted(RESULTS.glob("*.json")):
        data = json.loads(path.read_text())
        for row in data if isinstance(data, list) else [data]:
            assert "command" in row, f"{path.name}: a row without its command"
            assert row["command"] or row.get("transcribed"), f"{path.name}: no command, and not marked transcribed"
            assert row.get("date") or re.match(r"20\d\d-\d\d-\d\d", row.get("run", "")), f"{path.name}: no date"


def test_superseded_rows_stay_in_the_file_and_out_of_the_tables():
    rows = [{"a": 1}, {"a": 2, "superseded": "by the next run"}, {"a": 3}]
    assert tables.current(rows) == [{"a": 1}, {"a": 3}]
    chains = json.loads((RESULTS / "cpu_sampling_profile_chains.json").read_text())
    gone = [r for r in chains if r.get("superseded")]
    assert gone and all(f"| {tables.ratio(r['ratio_with_generation'])} |" not in tables.sampling_chains() for r in gone)


def test_the_readme_quotes_at_most_five_figures_all_generated():
    readme = (doc_blocks.REPO / "README.md").read_text()
    headline = next(m.group("body") for m in doc_blocks.BLOCK.finditer(readme) if m.group("name") == "headline")
    assert 0 < len([line for line in headline.splitlines() if line.startswith("- ")]) <= 5
    by_hand = [m.group(0) for m in MEASURED.finditer(_outside_blocks(readme))]
    assert by_hand == [], f"the README quotes measurements outside its generated headline: {by_hand}"


def test_the_docs_hold_no_dated_measurement_outside_the_tables():
    """Dates belong to results files; the only dates left in the prose are upstream merges the docs cite."""
    for path in doc_blocks.documents():
        for m in re.finditer(r"(\w+ )?\b20\d\d-\d\d-\d\d\b", _outside_blocks(path.read_text())):
            assert (m.group(1) or "").strip() == "merged", f"{path.name}: a dated passage: {m.group(0)!r}"
