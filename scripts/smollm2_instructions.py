"""A templated instruction set for training and evaluating a SmolLM2 draft head; no downloaded data.

Contract: `instructions(seed, n)` returns `n` distinct `Instruction`s, the same for the same seed,
spread round-robin over CATEGORIES (writing, explanation, lists, math word problems, coding,
conversation, how-to, comparison). Each is one user turn built from a category's templates and slot
vocabularies below with `random.Random(seed)`; math problems carry freshly drawn numbers. `split`
draws train / validation / evaluation sets from separate seeds and removes from each later set any
text already in an earlier one, so the three are disjoint. `HANDWRITTEN` are a few prompts outside
the templates, for the evaluation file only.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

TOPICS = [
    "photosynthesis", "the water cycle", "volcanoes", "black holes", "the immune system", "earthquakes",
    "the printing press", "electricity", "rainbows", "the moon's phases", "recycling", "vaccines",
    "the internet", "bees", "coral reefs", "the Roman Empire", "gravity", "the human heart", "tides",
    "solar panels", "clouds", "the stock market", "compound interest", "sleep", "coffee", "chess",
    "the Great Wall of China", "dinosaurs", "glaciers", "migration of birds", "batteries", "magnets",
    "the seasons", "fermentation", "democracy", "the Olympic Games", "deserts", "rain forests",
    "the solar system", "DNA", "antibiotics", "wind turbines", "bridges", "the piano", "maps",
]
THINGS = [
    "a lighthouse", "an old bicycle", "a rainy afternoon", "a small bakery", "a city at night", "the ocean",
    "a mountain village", "a lost key", "a friendly robot", "a library", "autumn leaves", "a train station",
    "a garden in spring", "a snowy forest", "a busy market", "a paper boat", "a grandmother's kitchen",
    "a broken clock", "a summer festival", "a quiet lake", "a dragon who loves tea", "a first day at school",
]
FORMS = ["a short poem", "a haiku", "a short story", "a paragraph", "a diary entry", "a limerick",
         "a product description", "a short speech", "a letter to a friend", "a news headline and summary"]
AUDIENCES = ["a ten-year-old", "a beginner", "a high school student", "someone who has never heard of it",
             "a busy manager", "my grandmother"]
LIST_SUBJECTS = [
    "healthy breakfast ideas", "ways to save money", "tips for learning a new language", "fruits high in vitamin C",
    "things to pack for a beach trip", "indoor hobbies", "benefits of regular exercise", "ways to reduce stress",
    "famous scientists", "popular programming languages", "board games for families", "ways to save water at home",
    "habits of good writers", "questions to ask in a job interview", "easy vegetables to grow", "uses of baking soda",
    "safety tips for cycling", "ways to be more productive", "animals that live in the Arctic", "kinds of clouds",
]
SKILLS = ["bake bread", "start running", "write a resume", "plant a tree", "learn to juggle", "make a budget",
          "clean a laptop keyboard", "prepare for an exam", "brew green tea", "change a flat bicycle tire",
          "organize a closet", "make a paper airplane", "take better photos with a phone", "start a journal",
          "cook rice", "learn to swim", "care for a houseplant", "write a cover letter", "start meditating",
          "make pancakes", "learn the guitar", "plan a birthday party", "fall asleep faster", "tie a tie",
          "make a smoothie", "train a puppy to sit", "save for a vacation", "study for a math test",
          "give a good presentation", "set up a home office", "paint a room", "make new friends in a new city",
          "wash a wool sweater", "read more books", "keep a conversation going", "pack a suitcase"]
PAIRS = [("cats", "dogs"), ("tea", "coffee"), ("trains", "planes"), ("summer", "winter"), ("books", "movies"),
         ("Python", "JavaScript"), ("renting", "buying a home"), ("cities", "the countryside"),
         ("solar power", "wind power"), ("email", "phone calls"), ("running", "swimming"),
         ("paper books", "e-readers"), ("weather", "climate"), ("viruses", "bacteria"), ("rice", "pasta"),
         ("bicycles", "cars"), ("mountains", "beaches"), ("working from home", "working in an office"),
         ("lions", "tigers"), ("democracy", "monarchy"), ("a laptop", "a desktop computer"), ("oil paint", "watercolor"),
         ("frogs", "toads"), ("baking", "frying"), ("jogging", "walking"), ("the sun", "the moon"),
         ("rivers", "lakes"), ("violins", "cellos"), ("hurricanes", "tornadoes"), ("savings accounts", "stocks"),
         ("sharks", "dolphins"), ("chess", "checkers"), ("podcasts", "radio"), ("wool", "cotton")]
LANG = ["Python", "JavaScript", "C", "Java", "Rust", "Go"]
CODE_TASKS = [
    "reverses a string", "checks whether a number is prime", "returns the largest element of a list",
    "counts the vowels in a string", "computes the factorial of n", "removes duplicates from a list",
    "checks whether a word is a palindrome", "converts Celsius to Fahrenheit", "returns the n-th Fibonacci number",
    "merges two sorted lists", "finds the average of a list of numbers", "counts words in a sentence",
]
CODE_QUESTIONS = ["What is a variable in programming?", "What does a for loop do?",
                  "What is the difference between a list and a tuple in Python?", "What is recursion?",
                  "What is an API?", "Why do programmers use version control?", "What is a hash table?",
                  "What does it mean for code to be object-oriented?", "What is a bug, and how do you find one?"]
NAMES = ["Anna", "Ben", "Carlos", "Dina", "Emma", "Farid", "Grace", "Hiro", "Ines", "Jack", "Lena", "Maya",
         "Noah", "Omar", "Priya", "Sam", "Tara", "Yusuf"]
ITEMS = ["apples", "pencils", "marbles", "stickers", "books", "cookies", "cards", "stamps", "shells", "coins"]
GREETINGS = ["Hi! How are you today?", "Hello, can you help me with something?", "Good morning!",
             "Hey, what can you do?", "Thanks for your help earlier!", "I'm bored. Any suggestions?",
             "Can you tell me a joke?", "What's a fun fact you know?", "I had a long day at work.",
             "Do you have a favorite book?", "I just got a new puppy!", "I'm nervous about my exam tomorrow."]
OCCASIONS = ["a rainy afternoon", "a free weekend", "a snowy day", "a long train ride", "a summer evening",
             "a birthday", "a day off work", "a quiet Sunday morning"]
FEELINGS = ["happy", "tired", "excited", "worried", "curious", "stressed", "proud"]


@dataclass(frozen=True)
class Instruction:
    id: str
    category: str
    text: str

    def row(self) -> dict:
        """A row of eagle-eval's plain prompt JSONL (a one-turn chat)."""
        return {"id": self.id, "category": self.category,
                "messages": [{"role": "user", "content": self.text}]}


def _writing(r: random.Random) -> str:
    form, thing = r.choice(FORMS), r.choice(THINGS)
    return r.choice([f"Write {form} about {thing}.", f"Can you write {form} about {thing}?",
                     f"Please write {form} describing {thing}.", f"Compose {form} inspired by {thing}.",
                     f"Write {form} about {thing} in a {r.choice(['cheerful', 'calm', 'sad', 'funny'])} tone."])


def _explanation(r: random.Random) -> str:
    topic = r.choice(TOPICS)
    return r.choice([f"Explain {topic} in simple terms.", f"How does {topic} work?", f"What is {topic}?",
                     f"Explain {topic} to {r.choice(AUDIENCES)}.", f"Why is {topic} important?",
                     f"Give me a short explanation of {topic}.", f"What are the main facts about {topic}?"])


def _lists(r: random.Random) -> str:
    n, subject = r.choice([3, 4, 5, 6, 7, 10]), r.choice(LIST_SUBJECTS)
    return r.choice([f"List {n} {subject}.", f"Give me {n} {subject}.", f"What are {n} {subject}?",
                     f"Make a numbered list of {n} {subject}.", f"Name {n} {subject} with a short note on each."])


def _math(r: random.Random) -> str:
    a = r.choice(NAMES)
    b = r.choice([x for x in NAMES if x != a])
    item, x, y, z = r.choice(ITEMS), r.randint(5, 60), r.randint(2, 12), r.randint(2, 9)
    price = r.choice([2, 3, 4, 5, 6, 8, 12, 15])
    return r.choice([
        f"{a} has {x} {item} and gives {y} to {b}. How many {item} does {a} have left?",
        f"{a} buys {z} boxes of {item} with {y} {item} in each box. How many {item} are there in total?",
        f"A shop sells {item} for {price} dollars each. How much do {z} {item} cost?",
        f"{a} has {x} {item}. {b} has {y} more than {a}. How many {item} do they have together?",
        f"{a} shares {z * y} {item} equally among {z} friends. How many does each friend get?",
        f"A train travels at {x} km per hour for {z} hours. How far does it go?",
        f"What is {x} plus {y} times {z}? Show your steps.",
        f"{a} reads {y} pages a day. How many pages does {a} read in {z} weeks?",
    ])


def _coding(r: random.Random) -> str:
    lang, task = r.choice(LANG), r.choice(CODE_TASKS)
    return r.choice([f"Write a {lang} function that {task}.", f"How do I write code in {lang} that {task}?",
                     f"Show me a {lang} example of a function that {task}.", r.choice(CODE_QUESTIONS),
                     f"Explain what this does: a {lang} function that {task}."])


def _conversation(r: random.Random) -> str:
    return r.choice([r.choice(GREETINGS), f"I feel {r.choice(FEELINGS)} today. Can we talk?",
                     f"My friend {r.choice(NAMES)} likes {r.choice(TOPICS)}. What gift should I get?",
                     f"What do you think about {r.choice(TOPICS)}?",
                     f"Can you recommend something to do on {r.choice(OCCASIONS)}?"])


def _howto(r: random.Random) -> str:
    skill = r.choice(SKILLS)
    return r.choice([f"How do I {skill}?", f"Give me step-by-step instructions to {skill}.",
                     f"What is the easiest way to {skill}?", f"I want to {skill}. Where should I start?",
                     f"What are common mistakes when people try to {skill}?", f"How long does it take to {skill}?",
                     f"Can you give me tips to {skill}?", f"Explain to {r.choice(AUDIENCES)} how to {skill}."])


def _compare(r: random.Random) -> str:
    a, b = r.choice(PAIRS)
    return r.choice([f"Compare {a} and {b}.", f"What is the difference between {a} and {b}?",
                     f"Which is better, {a} or {b}? Give pros and cons.", f"How are {a} and {b} alike?",
                     f"Should I choose {a} or {b}?", f"Explain the difference between {a} and {b} to {r.choice(AUDIENCES)}.",
                     f"Write a short comparison of {a} and {b}."])


CATEGORIES = {"writing": _writing, "explanation": _explanation, "lists": _lists, "math": _math,
              "coding": _coding, "conversation": _conversation, "howto": _howto, "compare": _compare}


def instructions(seed: int, n: int, exclude: frozenset[str] = frozenset()) -> list[Instruction]:
    """n distinct instructions, categories round-robin, none of whose texts is in `exclude`."""
    r = random.Random(seed)
    seen, out = set(exclude), []
    names = list(CATEGORIES)
    tries = 0
    while len(out) < n:
        cat = names[len(out) % len(names)]
        text = CATEGORIES[cat](r)
        tries += 1
        if tries > 200 * n:
            raise ValueError(f"only {len(out)} distinct instructions for seed {seed} (wanted {n})")
        if text in seen:
            continue
        seen.add(text)
        out.append(Instruction(f"{cat}-{seed}-{len(out):05d}", cat, text))
    return out


def split(seeds: tuple[int, int, int], sizes: tuple[int, int, int]) -> tuple[list, list, list]:
    """(train, validation, evaluation) from three seeds; later sets exclude earlier texts."""
    train = instructions(seeds[0], sizes[0])
    val = instructions(seeds[1], sizes[1], frozenset(i.text for i in train))
    evals = instructions(seeds[2], sizes[2], frozenset(i.text for i in train + val))
    return train, val, evals


HANDWRITTEN = [
    "What should I consider before adopting a cat?",
    "Summarize the plot of a typical detective story in three sentences.",
    "Why do leaves change color in the fall?",
    "Suggest a name for a small coffee shop and explain your choice.",
    "How can I explain fractions to a child using pizza?",
    "Write a thank-you note to a teacher.",
    "What is the best way to memorize a speech?",
    "Describe a sunset to someone who cannot see.",
]
