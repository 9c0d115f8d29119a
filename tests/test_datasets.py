"""Dataset readers on the fixtures in tests/data (ids, categories, turns), selection, and bad input."""

import json
from pathlib import Path

import pytest

from eagle_eval.workload.data import DataError
from eagle_eval.workload.datasets import read_questions, select

DATA = Path(__file__).parent / "data"


@pytest.mark.parametrize("name, fmt, ids, categories, turns", [
    ("mt_bench_question.jsonl", "mt_bench", ["81", "82", "111"], ["writing", "writing", "math"], [2, 2, 2]),
    ("spec_bench_question.jsonl", "spec_bench", ["81", "161", "241", "321"],
     ["writing", "translation", "summarization", "qa"], [2, 1, 1, 1]),
    ("gsm8k_test.jsonl", "gsm8k", ["1", "2", "3"], ["gsm8k"] * 3, [1, 1, 1]),
    ("humaneval.jsonl", "humaneval", ["HumanEval/0", "HumanEval/1"], ["humaneval"] * 2, [1, 1]),
    ("alpaca_data.json", "alpaca", ["1", "2", "3"], ["alpaca"] * 3, [1, 1, 1]),
    ("sharegpt.json", "sharegpt", ["sg-a", "sg-b"], ["sharegpt"] * 2, [2, 1]),
    ("prompts.jsonl", "prompts", ["text-1", "chat-1", "ids-1"], ["plain", "chat", "plain"], [0, 0, 0]),
])
def test_each_reader_on_its_fixture(name, fmt, ids, categories, turns):
    questions, detected, _ = read_questions(DATA / name)
    assert detected == fmt
    assert [q.id for q in questions] == ids
    assert [q.category for q in questions] == categories
    assert [len(q.turns) for q in questions] == turns


def test_turn_texts():
    mt = {q.id: q for q in read_questions(DATA / "mt_bench_question.jsonl")[0]}
    assert mt["81"].turns == ("w10 w11 w12 w13", "w14 w15 w16")
    alpaca = read_questions(DATA / "alpaca_data.json")[0]
    assert alpaca[0].turns == ("w34 w35 w36",)                     # empty input: the instruction alone
    assert alpaca[1].turns == ("w39 w40\n\nw41 w42 w43",)           # instruction, blank line, input
    sharegpt = read_questions(DATA / "sharegpt.json")[0]
    assert sharegpt[0].turns == ("w50 w51 w52", "w55 w56")           # the human turns, gpt answers dropped
    assert sharegpt[1].turns == ("w59 w60 w61",)                     # the system turn is not a user turn
    plain = read_questions(DATA / "prompts.jsonl")[0]
    assert plain[2].row == {"id": "ids-1", "category": "plain", "input_ids": [1, 12, 13, 14, 15]}


def test_parquet_and_save_to_disk_folders(tmp_path):
    import datasets

    rows = [json.loads(line) for line in (DATA / "gsm8k_test.jsonl").read_text().splitlines()]
    datasets.Dataset.from_list(rows).to_parquet(str(tmp_path / "gsm8k.parquet"))
    datasets.Dataset.from_list(rows).save_to_disk(str(tmp_path / "folder"))
    datasets.DatasetDict({"train": datasets.Dataset.from_list(rows[:1]),
                          "test": datasets.Dataset.from_list(rows)}).save_to_disk(str(tmp_path / "dict"))
    expected = [q.turns for q in read_questions(DATA / "gsm8k_test.jsonl")[0]]
    for path in ("gsm8k.parquet", "folder", "dict"):
        questions, fmt, table = read_questions(tmp_path / path)
        assert fmt == "gsm8k" and [q.turns for q in questions] == expected
    assert read_questions(tmp_path / "dict")[2].split == "test"


def test_explicit_format_and_selection():
    questions, fmt, _ = read_questions(DATA / "spec_bench_question.jsonl", "mt_bench")
    assert fmt == "mt_bench"
    picked = select(questions, "f", categories=("qa", "writing"))
    assert [q.id for q in picked] == ["81", "321"]
    orders = {tuple(q.id for q in select(questions, "f", shuffle_seed=s)) for s in range(6)}
    assert len(orders) > 1                                           # the seed changes the order ...
    assert select(questions, "f", shuffle_seed=3) == select(questions, "f", shuffle_seed=3)   # ... reproducibly
    assert [q.id for q in select(questions, "f", shuffle_seed=3, limit=2)] == \
        [q.id for q in select(questions, "f", shuffle_seed=3)][:2]
    with pytest.raises(DataError, match="f: --categories 'poetry' matches no question"):
        select(questions, "f", categories=("poetry",))


@pytest.mark.parametrize("name, text, match", [
    ("mt.jsonl", '{"question_id": 1, "category": "a", "turns": ["w5"]}\n{"question_id": 2, "turns": "w6"}\n',
     r"mt.jsonl:2: key 'turns' must be"),
    ("mt.jsonl", '{"question_id": 1, "turns": ["w5"]}\n{"question_id": 1, "turns": ["w6"]}\n',
     r"mt.jsonl:2: duplicate id '1'"),
    ("x.jsonl", '{"text": "w5"}\n', r"x.jsonl: cannot tell the dataset format from the columns \['text'\]"),
    ("x.jsonl", '{"turns": ["w5"]}\nnot json\n', r"x.jsonl:2: not valid JSON"),
    ("sg.json", '[{"id": "a", "conversations": [{"from": "gpt", "value": "w5"}]}]',
     r"sg.json row 1: key 'conversations' has no human turn"),
    ("he.json", '[{"task_id": "HumanEval/0", "prompt": ""}]', r"he.json row 1: key 'prompt' must be a non-empty"),
    ("bad.parquet", "not parquet", r"bad.parquet: cannot be read as a dataset"),
    ("x.csv", "a,b\n", r"x.csv: expected a .jsonl, .json or .parquet file"),
])
def test_bad_input_names_the_file(tmp_path, name, text, match):
    (tmp_path / name).write_text(text)
    with pytest.raises(DataError, match=match):
        read_questions(tmp_path / name)


def test_missing_file_and_missing_column(tmp_path):
    with pytest.raises(DataError, match="nope.jsonl: dataset does not exist"):
        read_questions(tmp_path / "nope.jsonl")
    with pytest.raises(DataError, match=r"gsm8k_test.jsonl: format alpaca needs column 'instruction'"):
        read_questions(DATA / "gsm8k_test.jsonl", "alpaca")
