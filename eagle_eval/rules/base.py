"""What every accept rule shares: the `Rule` record, the draws, and the two kinds of decode policy.

Contract: a rule is ONE `Rule` record (its engine's file: rules/vllm.py, sglang.py, eagle.py; `registry.RULES` names
them, lazily), and every table that used to be looked up by the rule's name derives from it: the policy class, the
filter order of p (`probs`, `filter_order`), the closed form of the expected acceptance (`node` for the one-hot rules,
`first` for sampled drafts), why it verifies chains only, whether it takes SGLang's thresholds, why it needs the full
vocab, whether its output is plain sampling from p. `rule(name)` gives the record, `policy_for` the decode policy
(GREEDY at temperature 0; refusing what the engine refuses), `describe` what a report echoes.

The policies: `OneHotRule` (deterministic drafts: the draft's argmax, or the top-k tree of loop/tree.py; a subclass
decides at one node) and `SampledDraftRule` (drafts sampled from q). After the last accepted node with no child left
to try (a leaf, or every draft of a chain accepted) the added token is drawn from p itself (the bonus). Every draw is
one float64 uniform of the decode's generator: coins compared with probabilities (u in [0, 1), so p = 0 is never
accepted and p = 1 always is), and tokens by inverse CDF over the vocab in id order (SGLang's final sampling; vLLM's
Gumbel-max and EAGLE's multinomial draw the same distribution from other streams). The engines' own random streams
are not reproduced: the distribution is, and our seeds reproduce our runs byte for byte.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace

import torch

from eagle_eval.loop.policy import GREEDY, DecodePolicy, SeatedRows
from eagle_eval.loop.tree import Tree
from eagle_eval.registry import RULES
from eagle_eval.rules.filters import draft_probs, target_probs
from eagle_eval.settings import ConfigError, DecodingSettings


@dataclass(frozen=True)
class Rule:
    """One accept rule at temperature > 0: everything eagle-eval knows of it (the module contract)."""
    name: str                               # the --accept-rule value
    engine: str                             # whose rule, in words ("vLLM 0.32", "SGLang", "EAGLE official")
    policy: type                            # the DecodePolicy class (a OneHotRule subclass or SampledDraftRule)
    probs: Callable                         # (logits [..., V] / T, decoding) -> p [..., V]: the engine's filter order
    filter_order: str                       # the same, in words (echoed in every report)
    drafts: str                             # what the drafts are, in words
    at_a_node: str                          # the acceptance at one node, in words
    residual: str                           # what the added token is drawn from when every child is rejected
    source: str                             # where the rule lives in the engine's source
    node: Callable | None = None            # one-hot: (a, valid [..., m], decoding) -> P(accept c_k | at parent)
    first: Callable | None = None           # sampled drafts: (p, q [..., V]) -> P(A >= 1), exact
    chain_only: str | None = None           # why it verifies chains only (None: trees too)
    thresholds: bool = False                # takes --accept-threshold-single / --accept-threshold-acc
    full_vocab: str | None = None           # why it needs the draft vocab equal to the target's
    lossless: Callable = lambda decoding: True   # noqa: E731  (its output is plain sampling from p at these settings)

    @property
    def sampled_drafts(self) -> bool:
        return self.first is not None

    @property
    def trees(self) -> bool:
        return self.chain_only is None


def rule(name: str) -> Rule:
    """The record of accept rule `name` (`registry.RULES`)."""
    if name not in RULES:
        raise ConfigError(f"--accept-rule {name}: expected one of {', '.join(RULES.names())}")
    return RULES.get(name)


def overlap(p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """sum_x min(p(x), q(x)) over the last dim: P(accept) of a draft sampled from q, kept with min(1, p/q) (the
    sampled-draft rules' exact P(A >= 1)).

    >>> round(float(overlap(torch.tensor([0.5, 0.5, 0.0]), torch.tensor([0.2, 0.4, 0.4]))), 6)
    0.6
    """
    return torch.minimum(p, q).sum(-1)


def coin(rng: torch.Generator) -> float:
    """One uniform in [0, 1), float64."""
    return float(torch.rand((), generator=rng, dtype=torch.float64))


def sample(weights: torch.Tensor, rng: torch.Generator) -> int:
    """A token drawn from weights [V] (>= 0, any positive total) by inverse CDF in float64 with one uniform;
    a zero weight is never drawn.

    >>> g = torch.Generator().manual_seed(0)
    >>> sorted({sample(torch.tensor([0.0, 3.0, 0.0, 1.0]), g) for _ in range(50)})
    [1, 3]
    """
    w = weights.detach().double().cpu()
    cdf = w.cumsum(0)
    total = float(cdf[-1])
    if not total > 0:
        raise ValueError("sampling from weights with no positive mass")
    i = int(torch.searchsorted(cdf, torch.tensor([coin(rng) * total], dtype=torch.float64), right=True)[0])
    if i >= len(w) or w[i] <= 0:             # u * total rounded up to the total: the last positive weight
        i = int(w.nonzero()[-1, 0])
    return i


def without(p: torch.Tensor, tokens: list[int]) -> torch.Tensor:
    """The one-hot rules' residual: p [V] with the rejected tokens zeroed (= relu(p - their one-hot mass));
    sampling renormalises it."""
    r = p.clone()
    r[tokens] = 0
    return r


def relu_residual(p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """The residual of the rules with sampled drafts: relu(p - q), p and q [V]."""
    return (p - q).clamp_min(0)


def _children(tree: Tree) -> dict[int, list[int]]:
    """Tree index -> its children's tree indices in sibling order (ascending index = draft rank)."""
    kids: dict[int, list[int]] = {}
    for i, parent in enumerate(tree.parents):
        if parent != -1:
            kids.setdefault(parent, []).append(i)
    return kids


def chain_tree(drafts: list[int]) -> Tree:
    """A chain d_1..d_S as a tree (root token unused: -1)."""
    n = len(drafts)
    return Tree(tokens=[-1] + list(drafts), parents=list(range(-1, n)), depths=list(range(n + 1)),
                ranks=[0] * (n + 1))


@dataclass
class OneHotRule:
    """The rules with deterministic drafts (vllm, sglang, eagle): the draft's argmax (chains) or the top-k tree
    of tree.py, q one-hot. `node` decides at one node: (the accepted child's position among the children, or
    None and the weights to sample the added token from)."""
    decoding: DecodingSettings
    rng: torch.Generator | None = None

    @property
    def name(self) -> str:
        return self.decoding.accept_rule

    def start(self, generator: torch.Generator | None, draft_vocab: torch.Tensor | None = None) -> "OneHotRule":
        if generator is None:
            raise ValueError(f"--accept-rule {self.name} at temperature {self.decoding.temperature}: a decode "
                             "needs its prompt's generator (sampling.prompt_generator)")
        return replace(self, rng=generator)

    def first_token(self, logits: torch.Tensor) -> int:
        return sample(target_probs(logits, self.decoding), self.rng)

    def propose(self, draft_logits: torch.Tensor) -> torch.Tensor:
        return draft_logits.argmax(-1)

    def accept_chain(self, drafts: list[int], target_logits: torch.Tensor) -> tuple[int, int]:
        path, token = self.accept_tree(chain_tree(drafts), target_logits)
        return len(path) - 1, token

    def accept_tree(self, tree: Tree, target_logits: torch.Tensor) -> tuple[list[int], int]:
        """Walk from the root: at each node the rule tries the children (target_logits [D, V] at each node);
        the added token comes from the residual of the last node, or from p at a leaf."""
        probs = target_probs(target_logits, self.decoding)                              # [D, V]
        kids = _children(tree)
        path, node = [0], 0
        while kids.get(node):
            picked, residual = self.node(probs[node], [tree.tokens[c] for c in kids[node]])
            if picked is None:
                return path, sample(residual, self.rng)
            node = kids[node][picked]
            path.append(node)
        return path, sample(probs[node], self.rng)

    def node(self, p: torch.Tensor, children: list[int]) -> tuple[int | None, torch.Tensor | None]:
        raise NotImplementedError

    def rows(self, batch: int) -> SeatedRows:
        return SeatedRows(batch)


@dataclass
class SampledDraftRule:
    """vllm-probabilistic and sglang-rs: each chain draft d_i ~ q_i = softmax(draft logits / T) (unfiltered),
    accepted iff u q_i(d_i) < p_i(d_i); at the first rejection the token comes from relu(p_i - q_i)."""
    decoding: DecodingSettings
    rng: torch.Generator | None = None
    draft_vocab: torch.Tensor | None = None          # [V_d] target id of each draft id
    proposed: list[torch.Tensor] = field(default_factory=list)    # q [V_d] of each draft since the last verify

    @property
    def name(self) -> str:
        return self.decoding.accept_rule

    def start(self, generator: torch.Generator | None, draft_vocab: torch.Tensor | None = None) -> "SampledDraftRule":
        if generator is None or draft_vocab is None:
            raise ValueError(f"--accept-rule {self.name}: a decode needs its prompt's generator and the draft "
                             "vocab map")
        return replace(self, rng=generator, draft_vocab=draft_vocab, proposed=[])

    def first_token(self, logits: torch.Tensor) -> int:
        return sample(target_probs(logits, self.decoding), self.rng)

    def propose(self, draft_logits: torch.Tensor) -> torch.Tensor:
        """draft_logits [1, V_d] -> the sampled draft id [1]; q is kept for the verify."""
        if draft_logits.shape[0] != 1:
            raise ValueError(f"--accept-rule {self.name} drafts one chain (got {draft_logits.shape[0]} rows)")
        q = draft_probs(draft_logits[0], self.decoding)                                 # [V_d]
        self.proposed.append(q)
        return torch.tensor([sample(q, self.rng)], device=draft_logits.device)

    def accept_chain(self, drafts: list[int], target_logits: torch.Tensor) -> tuple[int, int]:
        if len(self.proposed) != len(drafts):
            raise AssertionError(f"{len(drafts)} drafts verified, {len(self.proposed)} proposed")
        probs = target_probs(target_logits, self.decoding)                              # [S+1, V]
        proposed, self.proposed = self.proposed, []
        for i, d in enumerate(drafts):
            q = torch.zeros_like(probs[i]).index_copy_(0, self.draft_vocab.to(probs.device),
                                                       proposed[i].to(probs.device))    # [V]
            if not coin(self.rng) * float(q[d]) < float(probs[i, d]):
                return i, sample(relu_residual(probs[i], q), self.rng)
        return len(drafts), sample(probs[len(drafts)], self.rng)

    def accept_tree(self, tree: Tree, target_logits: torch.Tensor) -> tuple[list[int], int]:
        raise ValueError(f"--accept-rule {self.name} verifies sampled chains, not trees "
                         f"({rule(self.name).chain_only})")

    def rows(self, batch: int) -> SeatedRows:
        return SeatedRows(batch)


def policy_for(decoding: DecodingSettings, topk: int = 1, head_name: str = "the draft head",
               draft_vocab_size: int | None = None, vocab_size: int | None = None) -> DecodePolicy:
    """The decode policy of `decoding` for a run drafting with `topk` (a tree when > 1); refuses what the
    engine refuses. draft_vocab_size / vocab_size: the head's (a full-vocab rule needs them equal)."""
    if decoding.greedy:
        return GREEDY
    record = rule(decoding.accept_rule)
    name = record.name
    if topk > 1 and record.chain_only:
        trees = [r.name for r in RULES.records() if r.trees]
        raise ConfigError(f"--accept-rule {name} with --topk {topk}: {record.chain_only}; use --topk 1, or "
                          f"--accept-rule {' or '.join(trees)}, which verify trees")
    thresholds = (decoding.accept_threshold_single, decoding.accept_threshold_acc)
    if not record.thresholds and thresholds != (1.0, 1.0):
        takers = " / ".join(r.name for r in RULES.records() if r.thresholds)
        raise ConfigError(f"--accept-threshold-single/--accept-threshold-acc {thresholds[0]:g}/{thresholds[1]:g}: "
                          f"SGLang's tree rule's thresholds (--accept-rule {takers}); --accept-rule {name} has none")
    if record.full_vocab and draft_vocab_size is not None and draft_vocab_size != vocab_size:
        raise ConfigError(f"{head_name}: draft vocab {draft_vocab_size} < target vocab {vocab_size}, and "
                          f"--accept-rule {name} {record.full_vocab}")
    return record.policy(decoding)


def not_plain_sampling(decoding: DecodingSettings) -> str | None:
    """Why the rule's output is not plain sampling from p by construction, in words (None when it is):
    SGLang's thresholds below 1 accept drafts more often than p says (as SGLang does)."""
    single, acc = decoding.accept_threshold_single, decoding.accept_threshold_acc
    if decoding.greedy or rule(decoding.accept_rule).lossless(decoding):
        return None
    return (f"--accept-rule sglang with thresholds single {single:g}, acc {acc:g} (below 1) accepts drafts beyond "
            "what p gives them, as SGLang does: its output is not plain sampling from p by construction")


def describe(decoding: DecodingSettings, topk: int = 1) -> dict:
    """What a report echoes of the decode policy: the settings, the rule's filter order, its drafts, whether the
    output is plain sampling, and the seeding convention."""
    record = rule(decoding.accept_rule)
    thresholds = {"single": decoding.accept_threshold_single, "acc": decoding.accept_threshold_acc} \
        if record.thresholds else None
    biased = not_plain_sampling(decoding) is not None
    return {
        "rule": record.name, "temperature": decoding.temperature, "top_k": decoding.top_k, "top_p": decoding.top_p,
        "min_p": decoding.min_p, "thresholds": thresholds, "seed": decoding.seed,
        "filter_order": record.filter_order,
        "drafts": "sampled from q = softmax(draft logits / T), a chain" if record.sampled_drafts
                  else "the deterministic top-k tree (draft softmax at T = 1)" if topk > 1
                  else "the draft's argmax, a chain",
        "output": "biased by thresholds below 1 (as in SGLang): not plain sampling" if biased else
                  "distributed as plain sampling from p (the filtered target distribution)",
        "draws": "every coin and token from sampling.prompt_generator(seed, prompt id, sample): a torch CPU generator "
                 "seeded by sha256('seed/prompt id/sample'); coins float64 uniforms, tokens by inverse CDF",
    }
