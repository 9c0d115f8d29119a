"""The generated parts of the docs: blocks between markers, filled by a generator and checked by a test.

A block in README.md or docs/*.md reads

    <!-- generated: NAME (python GENERATOR) -->
    ...text the generator wrote...
    <!-- end generated: NAME -->

and everything outside the markers is written by hand. `fill(text, blocks)` replaces the text of every block
whose NAME `blocks` holds and leaves the others alone (another generator owns them); `stale(blocks)` lists
the files whose blocks differ from what `blocks` would write. Two generators use it: `scripts/house_map.py`
(docs/design.md's map of the package) and `benchmarks/tables.py` (the measurement tables, from
benchmarks/results/*.json). tests/test_docs_generated.py checks both are current.
"""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
BLOCK = re.compile(r"(<!-- generated: (?P<name>[\w.-]+)[^>]*-->\n)(?P<body>.*?)(<!-- end generated: (?P=name) -->)",
                   re.S)


def documents() -> list[Path]:
    """Every file that may hold a generated block."""
    return [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]


def names_in(text: str) -> list[str]:
    """The names of the blocks in `text`, in order."""
    return [m.group("name") for m in BLOCK.finditer(text)]


def fill(text: str, blocks: dict[str, str]) -> str:
    """`text` with the body of every block named in `blocks` replaced by that text (ending in one newline)."""
    def body(m: re.Match) -> str:
        name = m.group("name")
        if name not in blocks:
            return m.group(0)
        return m.group(1) + blocks[name].rstrip("\n") + "\n" + m.group(4)
    return BLOCK.sub(body, text)


def stale(blocks: dict[str, str]) -> list[str]:
    """Files (relative to the repository) whose blocks named in `blocks` are not what `blocks` would write, and
    names in `blocks` that no document holds."""
    out, seen = [], set()
    for path in documents():
        text = path.read_text()
        seen.update(names_in(text))
        if fill(text, blocks) != text:
            out.append(str(path.relative_to(REPO)))
    return out + [f"no document holds a block named {name!r}" for name in sorted(set(blocks) - seen)]


def write(blocks: dict[str, str]) -> list[str]:
    """Fill every document's blocks named in `blocks`; the files changed (relative to the repository)."""
    changed = []
    for path in documents():
        text = path.read_text()
        new = fill(text, blocks)
        if new != text:
            path.write_text(new)
            changed.append(str(path.relative_to(REPO)))
    return changed


def main(blocks: dict[str, str], argv: list[str], command: str) -> int:
    """`command` (writes the blocks) or `command --check` (exit 1 naming what is stale)."""
    if "--check" in argv:
        bad = stale(blocks)
        for line in bad:
            print(f"stale: {line} (run: {command})")
        return 1 if bad else 0
    for name in write(blocks):
        print(f"wrote {name}")
    return 0
