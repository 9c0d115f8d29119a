"""The docs' tables of the named things, generated from their records: the accept rules (docs/sampling.md, from
`registry.RULES`), the head kinds (docs/design.md, from `registry.HEAD_KINDS`) and the serving engines
(docs/server-check.md, from `registry.ENGINES`). A rule, kind or engine is one record; its row in the docs comes from
it, so a new one needs no hand edit of a table.

    python scripts/registry_tables.py            # rewrites the blocks
    python scripts/registry_tables.py --check    # exit 1 if one is stale (tests/test_seams.py)
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from doc_blocks import main  # noqa: E402

COMMAND = "python scripts/registry_tables.py"


def _table(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    return "\n".join(lines + ["| " + " | ".join(row) + " |" for row in rows])


def accept_rules() -> str:
    from eagle_eval.registry import RULES
    from eagle_eval.settings import DecodingSettings

    default = DecodingSettings().accept_rule
    rows = [[f"`{r.name}`" + (" (default)" if r.name == default else ""), r.drafts, r.at_a_node, r.residual,
             "chains only" if r.chain_only else "chains and trees", r.filter_order, r.source]
            for r in RULES.records()]
    return _table(["`--accept-rule`", "drafts", "at one node (children in sibling order = the draft's rank)",
                   "all rejected: the added token from", "verifies", "filter order of p", "engine source"], rows)


def head_kinds() -> str:
    from eagle_eval.registry import HEAD_KINDS

    rows = [[f"`{k.name}`", k.description, k.architectures] for k in HEAD_KINDS.records()]
    return _table(["head kind (report `config.head.kind`)", "what it is", "config.json `architectures` it reads"],
                  rows)


def serving_engines() -> str:
    from eagle_eval.registry import ENGINES

    rows = [[f"`{e.name}`", e.figure, e.figure_definition] for e in ENGINES.records()]
    return _table(["`--backend`", "the per-request figure it reports", "its definition"], rows)


def blocks() -> dict[str, str]:
    return {"accept-rules": accept_rules(), "head-kinds": head_kinds(), "serving-engines": serving_engines()}


if __name__ == "__main__":
    sys.exit(main(blocks(), sys.argv[1:], COMMAND))
