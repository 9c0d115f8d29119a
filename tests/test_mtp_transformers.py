"""MTP against a reference nobody here wrote: transformers' own `generate(use_mtp=True)` (5.25: `MTPCandidateGenerator`,
`MtpModel`, greedy verification in `_assisted_decoding`), for the layouts it covers (DeepSeek-V3, GLM-4.5), with
`--mtp-convention transformers`: the same greedy tokens, and the same accepted drafts per cycle, read where
transformers hands them to `update_candidate_strategy` (its `n_matches`). transformers crops the last cycle's count
at the budget (its valid tokens less one); the oracle counts every draft the target accepted, as vLLM does, so the
last cycle is compared as transformers counts it: the tokens it emitted, less one.

transformers reads the MTP layers again from the checkpoint (`MtpModel.from_pretrained`) through the target class's
`_keys_to_ignore_on_load_unexpected`, whose patterns name layer 61 (DeepSeek-V3) or 92 / 46 (GLM-4.5): for these tiny
targets (N = 2) the patterns are set to layer N on the loaded instance, as for any checkpoint whose N is not those.
"""

from __future__ import annotations

import pytest
import torch
from mtp_fixtures import read_prompts

from eagle_eval import api
from eagle_eval.records import Prompt
from eagle_eval.settings import Settings

NEW = 18


def transformers_mtp(folder, prompt, new_tokens):
    """(tokens, n_matches per cycle after the prefill) of transformers' generate(use_mtp=True)."""
    from transformers import AutoModelForCausalLM
    from transformers.generation import candidate_generator

    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    n = model.config.num_hidden_layers
    model._keys_to_ignore_on_load_unexpected = [rf"model\.layers\.{n}\..*"]
    counts = []
    original = candidate_generator.MTPCandidateGenerator.update_candidate_strategy

    def record(self, input_ids, scores, num_matches):
        counts.append(int(num_matches))
        return original(self, input_ids, scores, num_matches)

    candidate_generator.MTPCandidateGenerator.update_candidate_strategy = record
    try:
        with torch.no_grad():
            out = model.generate(torch.tensor([prompt]), max_new_tokens=new_tokens, do_sample=False, use_mtp=True,
                                 eos_token_id=2, pad_token_id=0)
    finally:
        candidate_generator.MTPCandidateGenerator.update_candidate_strategy = original
    return out[0, len(prompt):].tolist(), counts[1:]                     # the first call is the prefill's


@pytest.mark.parametrize("family", ["deepseek_v3", "glm4_moe"])
def test_generate_use_mtp_gives_the_oracles_tokens_and_accepted_counts(mtp_targets, family):
    folder, prompts = mtp_targets(family)
    o = api.load_oracle(Settings.of(target=str(folder), draft="mtp", num_steps=1, dtype="fp32",
                                    mtp_convention="transformers", max_new_tokens=NEW))
    conv = o.resolved.head.extra["mtp"]["convention"]
    assert (conv["engine"], conv["input"], conv["mask_position0"]) == ("transformers", "post", False)
    accepted = 0
    for i, p in enumerate(read_prompts(prompts)[:4]):
        rec = o.decode(Prompt(id=f"p{i}", category="c", input_ids=p))
        tokens, counts = transformers_mtp(folder, p, NEW)
        assert rec.output_ids == tokens, f"prompt {i}"
        assert counts[:-1] == rec.accepted_per_cycle[:-1], f"prompt {i}"
        assert counts[-1] == rec.emitted_per_cycle[-1] - 1, f"prompt {i}"           # transformers' crop at the end
        accepted += sum(counts)
    assert accepted > 0


def test_transformers_convention_refuses_what_transformers_cannot_run(mtp_targets):
    folder, _ = mtp_targets("glm4_moe")
    with pytest.raises(Exception, match="transformers drafts exactly one token per MTP layer"):
        api.load_oracle(Settings.of(target=str(folder), draft="mtp", num_steps=2, dtype="fp32",
                                    mtp_convention="transformers"))
    folder, _ = mtp_targets("mimo")
    with pytest.raises(Exception, match="transformers 5.25 has no MTP generation for mimo"):
        api.load_oracle(Settings.of(target=str(folder), draft="mtp", num_steps=1, dtype="fp32",
                                    mtp_convention="transformers"))
