"""The self-generated corpus, prompts and tokenizer behind the bundled default checkpoints.

Contract: pure Python plus `tokenizers`/`transformers` for the tokenizer; no torch, no downloads.
Everything is a function of a seed. Four task families, each with a continuation that is fully
determined by the prompt (plus tables the target memorises) and never periodic, so a small target
learns to continue them with varied, loop-free greedy text:

| category | row kind   | task                                                                      |
|----------|------------|---------------------------------------------------------------------------|
| counting | `prompt`   | "Count up by ones from 418:" -> " 418, 419, 420, ..." (ones or tens)      |
| glossary | `messages` | "* knife: TuMil" lines: a walk through a memorised word order, each word  |
|          |            | with its invented "Velsh" translation                                     |
| story    | `messages` | a walk through a memorised route of invented towns; what the hero does in |
|          |            | each town is memorised                                                    |
| list     | `messages` | a numbered packing list from a given number, items in the same word order |

Every dependency is local (the previous number, the latest noun or town, the name in the prompt)
plus a memorised table, so a small target learns it in minutes on a CPU (no induction over long
prompts needed), and the successor tables are single long cycles (120 words, 30 towns), so no walk
repeats within a greedy check. Training answers have random lengths and the bundled prompts ask for
long ones, so greedy decoding runs well past 64 tokens.
Digits are single tokens (so counting is learnable digit by digit); words keep their leading space.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

CATEGORIES = ("counting", "glossary", "story", "list")
LANGUAGE = "Velsh"
BOS, EOS, PAD = "<s>", "</s>", "<pad>"
ROLE_TOKENS = ("<|system|>", "<|user|>", "<|assistant|>")
# Zephyr-style: every turn ends with the eos token, so generation stops at the end of the answer.
CHAT_TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}<|{{ message['role'] }}|>\n"
    "{{ message['content'] }}{{ eos_token }}\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)
# pre-tokenizer pieces: a word with its leading space, ONE digit, a punctuation run, a newline, spaces
# (a capital starts a new piece, so invented CamelCase words split into syllables: " Sas", "Fur", "Ik")
_SPLIT_PATTERN = r" ?[A-Z][a-z]*| ?[a-z]+| ?[0-9]| ?[^A-Za-z0-9\s]+|\n|\s+"

NOUNS = (
    "apple bread chair table river stone cloud house horse bird fish tree flower garden window door "
    "road mountain forest island ship boat candle lamp book letter paper pencil basket bottle cup "
    "plate spoon knife fork clock mirror key coin ring crown sword shield hat coat shoe glove blanket "
    "pillow bed wall roof village city field cow sheep goat pig dog cat mouse wolf bear fox rabbit "
    "deer owl duck goose frog snake bee ant spider sun moon star rain snow wind fire water ice sand "
    "salt sugar honey milk cheese butter egg rice soup tea bell drum flute song dream friend king "
    "queen child farmer baker sailor teacher doctor painter hunter wheel hammer rope ladder bucket "
    "carpet button feather shell leaf"
).split()
NAMES = ("Mia Tom Anna Leo Sara Ben Nora Max Lucy Jack Emma Oscar Ivy Paul Rosa Hugo Lena Finn Clara "
         "Omar Greta Ravi Zoe Milo Ada Felix Iris Jonas Kira Luca Maya Nils Olga Pia Quinn Rita Sven "
         "Tara Uma Victor").split()
STORY_VERBS = ("found", "saw", "bought", "painted", "lost", "fixed", "picked up", "drew", "sold", "hid",
               "carried", "cleaned", "borrowed", "washed", "dropped", "counted")
STORY_ADJECTIVES = ("silver golden tiny broken shiny green wooden heavy purple dusty bright small strange "
                    "red blue noisy quiet gentle yellow black white pink warm cold soft hard round narrow "
                    "crooked famous lucky secret magic sleepy funny tall short brave clever").split()
_ONSETS = ("B", "D", "F", "G", "K", "L", "M", "N", "P", "R", "S", "T", "V", "Z", "Sh", "Th")
_VOWELS = ("a", "e", "i", "o", "u", "ai", "ou")
_CODAS = ("", "", "n", "r", "l", "k", "s")
NUM_SYLLABLES = 40            # invented words share this small inventory: a syllable alone says
NUM_TOWNS = 30                # little about the next one, the word it belongs to does


@dataclass(frozen=True)
class Document:
    """One training text or evaluation prompt: `prompt` (plain text) XOR `messages` (chat)."""
    category: str
    completion: str
    prompt: str | None = None
    messages: tuple[dict, ...] | None = None


@dataclass(frozen=True)
class World:
    """The memorised tables. Successor maps are single cycles, so a walk never repeats sooner than
    the cycle length (>= 30 steps of >= 4 tokens each): greedy continuations cannot loop.
    Velsh words and town names are CamelCase strings of 2-3 syllables from one small inventory."""
    lexicon: dict[str, str] = field(default_factory=dict)        # English noun -> Velsh word
    next_word: dict[str, str] = field(default_factory=dict)      # lesson and packing order (one cycle)
    towns: tuple[str, ...] = ()
    next_town: dict[str, str] = field(default_factory=dict)      # story route (one cycle)
    events: dict[str, tuple[str, str, str]] = field(default_factory=dict)  # town -> (verb, adj, noun)


def _cycle(rng: random.Random, items) -> dict:
    order = list(items)
    rng.shuffle(order)
    return {a: b for a, b in zip(order, order[1:] + order[:1])}


def _invented_words(rng: random.Random, n: int) -> list[str]:
    syllables = sorted({o + v + c for o in _ONSETS for v in _VOWELS for c in _CODAS})
    inventory = rng.sample(syllables, NUM_SYLLABLES)
    words: list[str] = []
    while len(words) < n:
        w = "".join(rng.sample(inventory, rng.choice((2, 3))))
        if w not in words:
            words.append(w)
    return words


def make_world(seed: int) -> World:
    rng = random.Random(seed)
    words = _invented_words(rng, len(NOUNS) + NUM_TOWNS)
    towns = tuple(words[len(NOUNS):])
    return World(
        lexicon=dict(zip(NOUNS, words)), next_word=_cycle(rng, NOUNS), towns=towns,
        next_town=_cycle(rng, towns),
        events={t: (rng.choice(STORY_VERBS), rng.choice(STORY_ADJECTIVES), rng.choice(NOUNS))
                for t in towns})


def _user(text: str) -> tuple[dict, ...]:
    return ({"role": "user", "content": text},)


def _walk(start, successor: dict, n: int) -> list:
    out = [start]
    while len(out) < n:
        out.append(successor[out[-1]])
    return out


# Each maker takes (rng, world, long): `long` asks for an answer longer than any greedy check reads;
# training answers have random lengths, so greedy decoding (argmax) keeps going rather than stopping.
def counting_doc(rng: random.Random, world: World, long: bool = False) -> Document:
    step = rng.choice((1, 1, 10))
    n = 60 if long else rng.randint(12, 40)
    start = rng.randint(100, 999 - step * 60)      # 60 numbers stay within three digits
    numbers = [start + step * i for i in range(n)]
    by = "tens" if step == 10 else "ones"
    return Document("counting", " " + ", ".join(map(str, numbers)) + ".",
                    prompt=f"Count up by {by} from {start}:")


def glossary_doc(rng: random.Random, world: World, long: bool = False) -> Document:
    first = rng.choice(NOUNS)
    words = _walk(first, world.next_word, 30 if long else rng.randint(6, 24))
    ask = rng.choice(("Teach me {} words, starting with {}.", "Give me {} words beginning at {}.",
                      "List {} words from {}."))
    lines = [f"* {w}: {world.lexicon[w]}" for w in words]
    return Document("glossary", "\n".join(lines), messages=_user(ask.format(LANGUAGE, first)))


def story_doc(rng: random.Random, world: World, long: bool = False) -> Document:
    name, first = rng.choice(NAMES), rng.choice(world.towns)
    towns = _walk(first, world.next_town, 8 if long else rng.randint(2, 8))
    sentences = [f"{name} woke up early and went to {first}."]
    for i, town in enumerate(towns):
        verb, adj, noun = world.events[town]
        if i:
            sentences.append(f"Then {name} walked to {town}.")
        sentences.append(f"In {town}, {name} {verb} a {adj} {noun}.")
    sentences.append(f"In the evening, {name} went home.")
    user = f"Tell me a story about {name}, starting in {first}."
    return Document("story", " ".join(sentences), messages=_user(user))


def list_doc(rng: random.Random, world: World, long: bool = False) -> Document:
    first, start = rng.choice(NOUNS), rng.randint(1, 150)
    items = _walk(first, world.next_word, 30 if long else rng.randint(6, 24))
    user = f"Write a packing list from number {start}, beginning with the {first}."
    lines = [f"{start + i}. {item}" for i, item in enumerate(items)]
    return Document("list", "\n".join(lines), messages=_user(user))


_MAKERS = {"counting": counting_doc, "glossary": glossary_doc, "story": story_doc, "list": list_doc}
# training mix: harder (memorisation) tasks get more documents
_MIX = (("counting", 3), ("glossary", 3), ("story", 3), ("list", 3))


def sample_documents(seed: int, n: int, world: World) -> list[Document]:
    """n training documents from the fixed mix, reproducible from `seed`."""
    rng = random.Random(seed)
    names = [c for c, w in _MIX for _ in range(w)]
    return [_MAKERS[rng.choice(names)](rng, world) for _ in range(n)]


def eval_documents(seed: int, per_category: int, world: World) -> list[Document]:
    """`per_category` bundled prompts of every category with long answers, pairwise different from
    their first line on (two chain walks from the same start would otherwise coincide). Rows are
    interleaved by category, so the first few (a `--limit`ed or quick run) cover every category."""
    rng = random.Random(seed)
    by_category = []
    for category in CATEGORIES:
        seen: set[str] = set()
        docs = []
        while len(docs) < per_category:
            doc = _MAKERS[category](rng, world, long=True)
            if doc.completion[:48] not in seen:
                seen.add(doc.completion[:48])
                docs.append(doc)
        by_category.append(docs)
    return [doc for row in zip(*by_category) for doc in row]


def prompt_key(doc: Document) -> str:
    return doc.prompt if doc.prompt is not None else doc.messages[0]["content"]


def prompt_rows(docs: list[Document]) -> list[dict]:
    """JSONL rows for data/prompts.jsonl: id, category, and `prompt` or `messages`."""
    rows, counts = [], {}
    for doc in docs:
        counts[doc.category] = counts.get(doc.category, 0) + 1
        row = {"id": f"{doc.category}-{counts[doc.category]:02d}", "category": doc.category}
        if doc.prompt is not None:
            row["prompt"] = doc.prompt
        else:
            row["messages"] = [dict(m) for m in doc.messages]
        rows.append(row)
    return rows


def train_tokenizer(texts: list[str], vocab_size: int):
    """A byte-level BPE over `texts`, wrapped as a `PreTrainedTokenizerFast` with the chat template."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(_SPLIT_PATTERN), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    tok.decoder = decoders.ByteLevel()
    special = [PAD, BOS, EOS, *ROLE_TOKENS]
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, min_frequency=2, special_tokens=special,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    tok.train_from_iterator(texts, trainer=trainer)
    tok.post_processor = processors.TemplateProcessing(
        single=f"{BOS} $A", pair=f"{BOS} $A {BOS} $B", special_tokens=[(BOS, tok.token_to_id(BOS))])
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token=BOS, eos_token=EOS, pad_token=PAD,
                                   model_max_length=1024)
    fast.chat_template = CHAT_TEMPLATE
    return fast


def render(doc: Document, tokenizer) -> tuple[str, str]:
    """(prompt text, completion text) exactly as the evaluator will tokenize the prompt.

    Chat prompts include bos through the template; plain prompts get bos from the post-processor,
    so the plain prompt text here carries no bos. The completion ends with eos.
    """
    if doc.messages is not None:
        prompt = tokenizer.apply_chat_template(list(doc.messages), add_generation_prompt=True,
                                               tokenize=False)
    else:
        prompt = doc.prompt
    return prompt, doc.completion + EOS
