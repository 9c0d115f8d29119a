"""The graph-captured and batched loops on a real GPU; skipped without CUDA.

In fp32 on the bundled pair: the chain cycle replayed as a CUDA graph gives the eager batched loop's
tokens and acceptance, and both equal the reference loop's, at batch 1 and batch 4; a MoE target falls
back to eager with its reason.
"""

import pytest
import torch
from fixtures import make_head, make_target, write_prompts
from test_batched import assert_same

from eagle_eval import api
from eagle_eval.settings import Settings
from eagle_eval.loop.batched import batched_decode
from eagle_eval.loop.reference import speculative_decode
from eagle_eval.workload.conversations import load_workload

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module")
def on_gpu():
    cfg = Settings.of(max_new_tokens=32, dtype="fp32", device_map="cuda:0")
    oracle = api.load_oracle(cfg)
    return oracle, [p.input_ids for p in load_workload(cfg.workload, oracle.tokenizer).first_prompts[:8]]


@pytest.mark.parametrize("num_steps,batch", [(3, 1), (5, 1), (3, 4)])
def test_graphed_loop_equals_eager_and_reference_fp32(on_gpu, num_steps, batch):
    oracle, prompts = on_gpu
    ref = [speculative_decode(oracle.speculator, p, num_steps, 32, oracle.eos_ids) for p in prompts]
    eager = batched_decode(oracle.speculator, prompts, num_steps, 32, oracle.eos_ids, batch, cuda_graphs=False)
    graph = batched_decode(oracle.speculator, prompts, num_steps, 32, oracle.eos_ids, batch, cuda_graphs=True)
    assert graph.cuda_graphs, graph.fallback
    assert_same(eager.decoded, graph.decoded)
    assert_same(ref, graph.decoded)
    assert sum(sum(d.accepted_per_cycle) for d in ref) > len(prompts)


def test_batched_trees_equal_batch_one_fp32(on_gpu):
    oracle, prompts = on_gpu
    ref = [speculative_decode(oracle.speculator, p, 3, 32, oracle.eos_ids, 3, 8) for p in prompts]
    assert_same(ref, batched_decode(oracle.speculator, prompts, 3, 32, oracle.eos_ids, 4, 3, 8).decoded)


def test_moe_target_falls_back_with_its_reason(tmp_path):
    cfg = Settings.of(target=str(make_target(tmp_path / "t", family="deepseek_v3")), draft=str(make_head(tmp_path / "h")),
                    prompts=str(write_prompts(tmp_path / "p.jsonl", n=2)), max_new_tokens=12, num_steps=3,
                    dtype="fp32", device_map="cuda:0")
    oracle = api.load_oracle(cfg)
    prompts = [p.input_ids for p in load_workload(cfg.workload, oracle.tokenizer).first_prompts]
    run = batched_decode(oracle.speculator, prompts, 3, 12, oracle.eos_ids, 2, cuda_graphs=True)
    assert not run.cuda_graphs and "experts" in run.fallback
    assert_same([speculative_decode(oracle.speculator, p, 3, 12, oracle.eos_ids) for p in prompts], run.decoded)
    assert torch.cuda.is_available()
