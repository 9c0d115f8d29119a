"""Drafting: the all-starts unroll equals the step-by-step chain of the loop."""

import pytest
import torch
from fixtures import head_config

from eagle_eval.heads.eagle3.layer import Eagle3Head
from eagle_eval.loop.draft import DraftState
from eagle_eval.profile.unroll import unroll_chains


@pytest.mark.parametrize("position_offset", [0, 1])
def test_unroll_equals_sequential_chain(position_offset):
    torch.manual_seed(0)
    head = Eagle3Head(head_config(draft_vocab=96)).eval()
    for p in head.parameters():
        if p.dim() > 1:
            torch.nn.init.normal_(p, std=0.3)
    emb = torch.nn.Embedding(96, 48)
    T, K = 12, 4
    x = torch.randint(0, 96, (1, T + 1))
    aux = torch.randn(1, T, 144)
    with torch.no_grad():
        logits = unroll_chains(head, aux, emb(x[:, 1:]), K, position_offset=position_offset)
        for p in range(T - K):
            state = DraftState(head, emb, position_offset)
            state.extend(aux[:, : p + 1], x[:, 1: p + 2])
            out = state.last_out
            for j in range(K):
                assert torch.allclose(head.logits(out)[0, -1], logits[j][0, p + j], atol=1e-5), (p, j)
                token = x[:, p + 2 + j].view(1, 1)               # teacher-forced next token
                pos = torch.tensor([[p + 1 + j + position_offset]])
                out = head.step(emb(token), out, pos, state.cache)


def test_propose_chain_leaves_only_real_pairs():
    torch.manual_seed(0)
    head = Eagle3Head(head_config(draft_vocab=96)).eval()
    emb = torch.nn.Embedding(96, 48)
    state = DraftState(head, emb)
    state.extend(torch.randn(1, 5, 144), torch.randint(0, 96, (1, 5)))
    drafts = state.propose_chain(4)
    assert drafts.shape == (4,) and state.real_len == 5
