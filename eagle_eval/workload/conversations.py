"""The workload: questions -> prompts -> sample records, turn by turn (no model of its own).

Contract: `load_workload` reads the dataset (`--dataset`, else the plain `--prompts` JSONL), selects
questions (--categories, --shuffle-seed, --limit) and renders every first turn up front, so bad rows
fail before any decoding. `run_turns` decodes each question turn by turn: turn t is rendered from the
user turns 1..t with, between them, the target's own answers to the earlier turns (the output of the
speculative decode, which is plain greedy), decoded to text without special tokens: what FastChat's
`gen_model_answer` and EAGLE's MT-Bench evaluation do. Each turn is one `SampleRecord` with `turn`
set; a question with several turns gets ids `ID/turn1`, `ID/turn2`, ... With --long-context each question is
one turn per length, its prompt built by workload/long_context.py (ids `ID/ctxL`).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Callable, Iterator

from eagle_eval.settings import WorkloadSettings, bundled_missing
from eagle_eval.records import Prompt, SampleRecord
from eagle_eval.workload.data import DataError, tokenize_row
from eagle_eval.workload.datasets import Question, read_jsonl_rows, read_questions, select, to_question
from eagle_eval.workload.templates import PromptFormat, ThinkingIgnored


@dataclass
class Workload:
    questions: list[Question]
    fmt: PromptFormat
    tokenizer: object
    first_prompts: list[Prompt]          # turn 1 of each question, rendered
    resolved: dict                       # echoed in report.json's config
    warnings: list[str] = field(default_factory=list)

    @property
    def num_prompts(self) -> int:
        """Prompts to decode: one per turn."""
        return sum(max(1, len(q.turns)) for q in self.questions)

    def pending(self, done) -> int:
        """Prompts (turns) not yet among the ids in `done`."""
        return sum(sample_id(q, t) not in done for q in self.questions for t in range(1, max(1, len(q.turns)) + 1))

    @property
    def sample_prompt(self) -> Prompt:
        return self.first_prompts[0]

    def expected_rows(self) -> dict[str, dict]:
        """{sample id: {category, turn, prompt_len}} of every row this workload writes, in order; the
        prompt length is known up front for first turns only (later turns hold the earlier answers)."""
        first = {p.id: len(p.input_ids) for p in self.first_prompts}
        return {sample_id(q, t): {"category": q.category, "turn": t, "prompt_len": first.get(sample_id(q, t))}
                for q in self.questions for t in range(1, max(1, len(q.turns)) + 1)}


def sample_id(question: Question, turn: int) -> str:
    return f"{question.id}/turn{turn}" if len(question.turns) > 1 else question.id


def conversation(question: Question, turn: int, answers: list[str]) -> list[dict]:
    """User turns 1..turn with the answers to turns 1..turn-1 between them.

    >>> q = Question("81", "writing", ("w5 w6", "w7"), "f")
    >>> [m["content"] for m in conversation(q, 2, ["w9 w10"])]
    ['w5 w6', 'w9 w10', 'w7']
    """
    msgs = []
    for user, answer in zip(question.turns[:turn - 1], answers):
        msgs += [{"role": "user", "content": user}, {"role": "assistant", "content": answer}]
    return msgs + [{"role": "user", "content": question.turns[turn - 1]}]


def turn_prompt(question: Question, turn: int, answers: list[str], fmt: PromptFormat, tokenizer) -> Prompt:
    if question.row is not None:
        ids, text = tokenize_row(question.row, tokenizer, question.where, fmt)
    else:
        ids, text = fmt.encode(tokenizer, conversation(question, turn, answers), question.where)
    return Prompt(id=sample_id(question, turn), category=question.category, input_ids=ids, text=text)


def _read(config: WorkloadSettings) -> tuple[list[Question], str, dict]:
    if config.dataset is None:        # the plain prompt JSONL: line-numbered errors, as before
        table = read_jsonl_rows(_existing(config.prompts))
        questions = [to_question("prompts", row, i, where) for i, (where, row) in enumerate(table.rows, 1)]
        _check_unique(questions)
        return questions, "prompts", {"path": config.prompts, "option": "--prompts", "split": None}
    questions, fmt, table = read_questions(config.dataset, config.dataset_format)
    return questions, fmt, {"path": config.dataset, "option": "--dataset", "split": table.split}


def _existing(path: str) -> Path:
    if Path(path).is_dir():
        raise DataError(f"{path}: is a folder; --prompts is a JSONL file (a benchmark folder saved with "
                        "save_to_disk goes to --dataset)")
    if not Path(path).is_file():
        why = bundled_missing(path)
        raise DataError(f"--prompts: {why}" if why else f"{path}: prompts file does not exist")
    return Path(path)


def _check_unique(questions: list[Question]) -> None:
    seen = set()
    for q in questions:
        if q.id in seen:
            raise DataError(f"{q.where}: duplicate id {q.id!r}")
        seen.add(q.id)


def load_workload(config: WorkloadSettings, tokenizer, limits=None) -> Workload:
    """limits: the oracle's (vocab, max positions, positions the decode adds, what sets the maximum), which caps
    the prompts --long-context builds (workload/long_context.py); None: no cap."""
    questions, fmt_name, source = _read(config)
    chosen = select(questions, source["path"], config.categories, config.shuffle_seed, config.limit)
    if not chosen:
        raise DataError(f"{source['path']}: no prompts")
    fmt = PromptFormat.resolve(tokenizer, config.no_chat_template, config.chat_template, config.system_prompt,
                               config.enable_thinking)
    long_context = None
    if config.long_context:
        from eagle_eval.workload.long_context import build
        chosen, long_context = build(questions, chosen, config.long_context, fmt, tokenizer, limits,
                                     config.shuffle_seed or 0, source["path"])
    first = [turn_prompt(q, 1, [], fmt, tokenizer) for q in chosen]
    if config.enable_thinking is not None:
        refuse_unread_thinking(config.enable_thinking, chosen, first, fmt, tokenizer, source)
    resolved = {
        "dataset_format": fmt_name,
        "dataset_format_given": config.dataset_format,
        "dataset_source": {**source, "questions_read": len(questions), "questions_used": len(chosen)},
        "template_sha256": fmt.template_sha256,
        "prompt_format": fmt.as_dict(),
        "multi_turn": "turn t>1 is rendered from the earlier user turns and the target's own greedy "
                      "answers to them (decoded without special tokens)",
        **({"long_context_workload": long_context} if long_context else {}),
    }
    return Workload(chosen, fmt, tokenizer, first, resolved)


def refuse_unread_thinking(value: bool, questions: list[Question], first: list[Prompt], fmt: PromptFormat,
                           tokenizer, source: dict) -> None:
    """--enable-thinking / --disable-thinking must change what the target reads: the first turns are rendered again
    with the switch the other way, and when no prompt changes (no template, no row that goes through it, or a template
    that does not read `enable_thinking`) the switch is refused (ThinkingIgnored), since thinking on and off would
    measure the same prompts. source: the workload's {"option", "path"}."""
    option, path = source["option"], source["path"]
    flag = "--enable-thinking" if value else "--disable-thinking"
    if fmt.template is None:
        raise ThinkingIgnored(f"{flag}: the target's tokenizer has no chat template, so nothing reads enable_thinking; "
                              f"give a template that reads it (--chat-template FILE) or leave {flag} out")
    templated = [(q, p) for q, p in zip(questions, first) if q.row is None or "messages" in q.row]
    if not templated:
        raise ThinkingIgnored(f"{flag}: no prompt of {option} {path} goes through the chat template (rows with "
                              "'input_ids' or 'prompt' are read as they are), so enable_thinking changes nothing; "
                              f"give 'messages' rows or a --dataset, or leave {flag} out")
    other = replace(fmt, enable_thinking=not value)      # fmt renders with `value`
    if all(turn_prompt(q, 1, [], other, tokenizer).input_ids == p.input_ids for q, p in templated):
        raise ThinkingIgnored(f"{flag}: the chat template ({fmt.source}) renders every prompt of {path} the same with "
                              "enable_thinking=True and False: it does not read the switch, so thinking on and off "
                              f"would be the same prompts; give a template that reads it (--chat-template FILE; "
                              f"Qwen3's does) or leave {flag} out")


def run_turns(workload: Workload, decode: Callable[[Prompt], SampleRecord],
              done: dict[str, SampleRecord] | None = None) -> Iterator[SampleRecord]:
    """Yield one new record per turn, in order; records in `done` (a resumed run) are not decoded
    again, but their answers still build the next turn."""
    for index in range(len(workload.questions)):
        for _, rec in question_turns(workload, index, decode, done or {}):
            yield rec


def question_turns(workload: Workload, index: int, decode: Callable[[Prompt], SampleRecord],
                   done: dict[str, SampleRecord]) -> Iterator[tuple[Prompt, SampleRecord]]:
    """(prompt, new record) for each turn of question `index` not in `done`, in turn order (a
    question's turns are decoded together: turn t+1 is built from the answer to turn t)."""
    question, first = workload.questions[index], workload.first_prompts[index]
    answers: list[str] = []
    for turn in range(1, max(1, len(question.turns)) + 1):
        prompt = first if turn == 1 else turn_prompt(question, turn, answers, workload.fmt, workload.tokenizer)
        rec = done.get(prompt.id)
        if rec is None:
            rec = decode(prompt)
            rec.turn = turn
            yield prompt, rec
        answers.append(workload.tokenizer.decode(rec.output_ids, skip_special_tokens=True).strip())


def sample_ids(workload: Workload) -> list[list[str]]:
    """The sample ids of each question's turns, in workload order."""
    return [[sample_id(q, t) for t in range(1, max(1, len(q.turns)) + 1)] for q in workload.questions]


def in_workload_order(workload: Workload, records: list[SampleRecord]) -> list[SampleRecord]:
    """`records` sorted as a single uninterrupted run writes them: question by question, turn by turn
    (an id the workload does not name, last)."""
    place = {sid: i for i, sid in enumerate(s for ids in sample_ids(workload) for s in ids)}
    return sorted(records, key=lambda r: place.get(r.id, len(place)))
