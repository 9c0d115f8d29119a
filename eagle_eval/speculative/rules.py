"""The decode policies at temperature > 0, engine by engine: what the draft proposes, what the target keeps
of it, and the token the target adds, with every random draw from the decode's own generator.

Contract: `policy_for(decoding, topk, head)` is the `DecodePolicy` (speculative/policy.py) of
`decoding.accept_rule`; GREEDY at temperature 0 (each rule's own temperature-0 behaviour is greedy too, tested).
p is `sampling.target_probs` (the rule's engine's filter order, `sampling.FILTER_ORDER`), q is
`sampling.draft_probs`. With the default thresholds every rule's emitted tokens are distributed exactly as
plain sampling from p, token by token (`--check-lossless` tests it, speculative/lossless.py); SGLang's
thresholds below 1 bias the output, as they do in SGLang.

| rule | drafts | at a node (children in sibling order = draft rank) | all rejected: sample from | engine source |
|---|---|---|---|---|
| vllm | draft argmax, chain | accept d iff u < p(d) | p with d removed | vLLM 0.32 `v1/sample/rejection_sampler.py` rejection_random_sample_kernel (draft_probs None: q = 1), `sample_recovered_tokens`; V2 `v1/worker/gpu/spec_decode/rejection_sampler_utils.py` |
| vllm-probabilistic | d ~ q, chain | accept d iff u q(d) < p(d) | relu(p - q) | the same kernels with draft probs (`draft_sample_method="probabilistic"`) |
| sglang | deterministic chain or tree (tree.py) | ONE coin u per depth; acc += p(c_k); accept c_k iff p(c_k) > 0 and (u < acc / t_acc or p(c_k) >= t_single) | p with every rejected child zeroed (relu(p - q), q = their mass) | SGLang `sgl-kernel/csrc/speculative/speculative_sampling.cuh` TreeSpeculativeSamplingTargetOnly |
| sglang-rs | d ~ q, chain, full vocab | accept d iff u q(d) < p(d) | relu(p - q) | SGLang `--speculative-use-rejection-sampling` (`speculative_sampling_classic_kernel`; refuses topk > 1, thresholds != 1, a reduced draft vocab) |
| eagle | deterministic chain or tree | a fresh coin per distinct child: accept iff u < p'(c), else p'(c) = 0 and p' renormalised | p' (p with the rejected children zeroed, renormalised) | SafeAILab/EAGLE `eagle/model/utils.py` evaluate_posterior |

After the last accepted node with no child left to try (a leaf, or every draft of a chain accepted) the
added token is drawn from p itself (the bonus). Every draw is one float64 uniform of the generator: coins
compared with probabilities (u in [0, 1), so p = 0 is never accepted and p = 1 always is), and tokens by
inverse CDF over the vocab in id order (SGLang's final sampling; vLLM's Gumbel-max and EAGLE's multinomial
draw the same distribution from other streams). The engines' own random streams are not reproduced: the
distribution is, and our seeds reproduce our runs byte for byte.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import torch

from eagle_eval.settings import ConfigError, DecodingSettings
from eagle_eval.speculative.policy import GREEDY, DecodePolicy, SeatedRows
from eagle_eval.speculative.sampling import draft_probs, target_probs
from eagle_eval.speculative.tree import Tree

CHAIN_ONLY = {
    "vllm": "vLLM 0.32 verifies EAGLE drafts as a chain (no token tree)",
    "vllm-probabilistic": "vLLM 0.32 verifies EAGLE drafts as a chain (no token tree)",
    "sglang-rs": "SGLang's rejection sampling (--speculative-use-rejection-sampling) needs "
                 "--speculative-eagle-topk 1",
}


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


class VllmRule(OneHotRule):
    """vLLM, draft_sample_method "greedy": the chain's one child d is accepted with p(d)."""

    def node(self, p, children):
        (d,) = children
        if coin(self.rng) < float(p[d]):
            return 0, None
        return None, without(p, [d])


class SglangRule(OneHotRule):
    """SGLang's tree rule: one coin per depth against the children's cumulative p, thresholds t_single/t_acc."""

    def node(self, p, children):
        u, acc = coin(self.rng), 0.0
        t_single, t_acc = self.decoding.accept_threshold_single, self.decoding.accept_threshold_acc
        for k, c in enumerate(children):
            a = float(p[c])
            acc += a
            if a > 0 and (u < acc / t_acc or a >= t_single):
                return k, None
        return None, without(p, children)


class EagleRule(OneHotRule):
    """EAGLE's rule: a fresh coin per distinct child against p renormalised after each rejection."""

    def node(self, p, children):
        residual, tried = p.double(), []
        for k, c in enumerate(children):
            if c in tried:
                continue
            if coin(self.rng) < float(residual[c]):
                return k, None
            tried.append(c)
            residual = without(residual, [c])
            residual = residual / residual.sum()
        return None, residual


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
        raise ValueError(f"--accept-rule {self.name} verifies sampled chains, not trees ({CHAIN_ONLY[self.name]})")

    def rows(self, batch: int) -> SeatedRows:
        return SeatedRows(batch)


RULES = {"vllm": VllmRule, "vllm-probabilistic": SampledDraftRule, "sglang": SglangRule,
         "sglang-rs": SampledDraftRule, "eagle": EagleRule}


def policy_for(decoding: DecodingSettings, topk: int = 1, head_name: str = "the draft head",
               draft_vocab_size: int | None = None, vocab_size: int | None = None) -> DecodePolicy:
    """The decode policy of `decoding` for a run drafting with `topk` (a tree when > 1); refuses what the
    engine refuses. draft_vocab_size / vocab_size: the head's (sglang-rs needs them equal)."""
    if decoding.greedy:
        return GREEDY
    rule = decoding.accept_rule
    if rule not in RULES:
        raise ConfigError(f"--accept-rule {rule}: expected one of {', '.join(RULES)}")
    if topk > 1 and rule in CHAIN_ONLY:
        raise ConfigError(f"--accept-rule {rule} with --topk {topk}: {CHAIN_ONLY[rule]}; use --topk 1, or "
                          "--accept-rule sglang or eagle, which verify trees")
    thresholds = (decoding.accept_threshold_single, decoding.accept_threshold_acc)
    if rule != "sglang" and thresholds != (1.0, 1.0):
        raise ConfigError(f"--accept-threshold-single/--accept-threshold-acc {thresholds[0]:g}/{thresholds[1]:g}: "
                          f"SGLang's tree rule's thresholds (--accept-rule sglang); --accept-rule {rule} has none")
    if rule == "sglang-rs" and draft_vocab_size is not None and draft_vocab_size != vocab_size:
        raise ConfigError(f"{head_name}: draft vocab {draft_vocab_size} < target vocab {vocab_size}, and "
                          "--accept-rule sglang-rs (SGLang's rejection sampling) needs the draft vocab equal to the "
                          "target's (SGLang refuses a reduced-vocab EAGLE-3 head there); use --accept-rule sglang")
    return RULES[rule](decoding)


def not_plain_sampling(decoding: DecodingSettings) -> str | None:
    """Why the rule's output is not plain sampling from p by construction, in words (None when it is):
    SGLang's thresholds below 1 accept drafts more often than p says (as SGLang does)."""
    single, acc = decoding.accept_threshold_single, decoding.accept_threshold_acc
    if decoding.greedy or decoding.accept_rule != "sglang" or (single, acc) == (1.0, 1.0):
        return None
    return (f"--accept-rule sglang with thresholds single {single:g}, acc {acc:g} (below 1) accepts drafts beyond "
            "what p gives them, as SGLang does: its output is not plain sampling from p by construction")


def describe(decoding: DecodingSettings, topk: int = 1) -> dict:
    """What a report echoes of the decode policy: the settings, the rule's filter order, its drafts, whether the
    output is plain sampling, and the seeding convention."""
    from eagle_eval.speculative.sampling import FILTER_ORDER

    rule = decoding.accept_rule
    sampled = rule in ("vllm-probabilistic", "sglang-rs")
    thresholds = {"single": decoding.accept_threshold_single, "acc": decoding.accept_threshold_acc} \
        if rule == "sglang" else None
    biased = not_plain_sampling(decoding) is not None
    return {
        "rule": rule, "temperature": decoding.temperature, "top_k": decoding.top_k, "top_p": decoding.top_p,
        "min_p": decoding.min_p, "thresholds": thresholds, "seed": decoding.seed,
        "filter_order": FILTER_ORDER[rule],
        "drafts": "sampled from q = softmax(draft logits / T), a chain" if sampled
                  else "the deterministic top-k tree (draft softmax at T = 1)" if topk > 1
                  else "the draft's argmax, a chain",
        "output": "biased by thresholds below 1 (as in SGLang): not plain sampling" if biased else
                  "distributed as plain sampling from p (the filtered target distribution)",
        "draws": "every coin and token from sampling.prompt_generator(seed, prompt id, sample): a torch CPU generator "
                 "seeded by sha256('seed/prompt id/sample'); coins float64 uniforms, tokens by inverse CDF",
    }
