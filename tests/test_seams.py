"""The seams the next issues plug into: the decode policy, the DraftHead protocol, the engine registry."""

import torch
from fixtures import make_head

from eagle_eval.heads.io import load_head
from eagle_eval.heads.protocol import DraftAttention, DraftHead
from eagle_eval.registry import ENGINES
from eagle_eval.servers.http import Http
from eagle_eval.servers.options import ServerCheckOptions
from eagle_eval.loop.policy import GREEDY, DecodePolicy
from eagle_eval.loop.tree import Tree


def test_both_head_kinds_implement_the_draft_head_protocol(tmp_path):
    from test_mla_head import mla_config
    from eagle_eval.heads.mla.layer import MLAHead

    llama = load_head(make_head(tmp_path / "h")).head
    mla = MLAHead(mla_config())
    for head in (llama, mla):
        assert isinstance(head, DraftHead) and isinstance(head.attention, DraftAttention)


def test_the_greedy_policy_is_every_engines_temperature_zero_rule():
    assert isinstance(GREEDY, DecodePolicy)
    logits = torch.full((4, 10), -1.0)
    for row, best in enumerate([5, 7, 2, 9]):
        logits[row, best] = 1.0
    assert GREEDY.accept_chain([5, 7, 9], logits) == (2, 2)          # d_3 = 9 != argmax 2; bonus = argmax after d_2
    assert GREEDY.accept_chain([4, 7, 9], logits) == (0, 5)
    tree = Tree(tokens=[0, 5, 6, 7], parents=[-1, 0, 0, 1], depths=[0, 1, 1, 2], ranks=[0, 0, 1, 0])
    assert GREEDY.accept_tree(tree, logits) == ([0, 1, 3], 9)
    assert GREEDY.first_token(logits[1]) == 7 and GREEDY.propose(logits[:2]).tolist() == [5, 7]


def test_every_engine_is_one_complete_record():
    for name, engine in zip(ENGINES.names(), ENGINES.records()):
        assert engine.name == name and engine.taps and engine.num_steps_setting
        opts = ServerCheckOptions(backend=name, url="http://127.0.0.1:1")
        client = engine.make_client(Http("http://127.0.0.1:1", 1.0, 0), opts)
        assert hasattr(client, "generate") and hasattr(client, "settings")
    # each engine's figure is its own (no engine is treated as another)
    assert ENGINES.get("sglang").figure_counts(12, 4, 7) == (12, 4)
    assert ENGINES.get("vllm").figure_counts(12, 4, 7) == (11, 4)
