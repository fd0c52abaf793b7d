"""The bundled datasets and the user-data loaders (spectest JSONL, ShareGPT, Spec-Bench)."""

import json
import re
from itertools import islice

import pytest

from spectest.loadgen.datasets import DatasetError, Record, data_dir, load_dataset, parse_record


@pytest.mark.parametrize("name", ["chat", "code", "rag"])
def test_bundled_records_have_the_shared_fields(name):
    path = data_dir() / f"{name}.jsonl"
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    assert len(rows) >= 250
    assert len({r["id"] for r in rows}) == len(rows)
    for r in rows:
        assert r["category"] == name
        assert ("messages" in r) != ("prompt" in r)
        assert isinstance(r["expected_output_tokens"], int)
        assert 16 <= r["expected_output_tokens"] <= 512
        assert r["license"] and r["source"]
    # the bundle stays small enough to commit
    assert sum(p.stat().st_size for p in data_dir().rglob("*") if p.is_file()) < 3_000_000


def test_chat_has_single_and_two_turn_mt_bench_questions():
    ds = load_dataset("chat")
    two_turn = [r for r in ds.records if r.turns]
    assert len(two_turn) == 80 and all(len(r.turns) == 1 for r in two_turn)
    assert sum(1 for r in ds.records if r.source.startswith("mt_bench") and not r.turns) == 80


def test_code_has_humaneval_completions_and_instructions():
    ds = load_dataset("code")
    completions = [r for r in ds.records if r.prompt is not None]
    instructions = [r for r in ds.records if r.messages is not None]
    assert len(completions) == len(instructions) == 164
    assert all("def " in r.prompt for r in completions)


def test_rag_records_are_retrieved_passages_plus_a_question():
    squad = {}
    for line in (data_dir() / "rag.jsonl").read_text().splitlines():
        r = json.loads(line)
        squad[r["source"]] = squad.get(r["source"], 0) + 1
        text = r["messages"][0]["content"]
        assert "Passages:" in text and "Question:" in text
        assert len(re.findall(r"\n\[\d+\] ", text)) >= 2
    assert set(squad) == {"squad_v2_dev", "hotpotqa_dev_distractor", "python3.11-doc"}


def test_mixed_is_the_union_and_replay_is_seeded():
    mixed = load_dataset("mixed")
    assert {r.category for r in mixed.records} == {"chat", "code", "rag"}
    a = [r.id for r in islice(mixed.stream(seed=7), 50)]
    b = [r.id for r in islice(load_dataset("mixed").stream(seed=7), 50)]
    c = [r.id for r in islice(mixed.stream(seed=8), 50)]
    w = [r.id for r in islice(mixed.stream(seed=7, worker=1), 50)]
    assert a == b and a != c and a != w


def test_stream_covers_every_record_each_epoch():
    ds = load_dataset("chat")
    first_epoch = [r.id for r in islice(ds.stream(seed=1), len(ds))]
    assert sorted(first_epoch) == sorted(r.id for r in ds.records)


def test_load_with_seed_is_a_reproducible_permutation():
    assert [r.id for r in load_dataset("rag", seed=3).records] == \
        [r.id for r in load_dataset("rag", seed=3).records]
    assert [r.id for r in load_dataset("rag", seed=3).records] != \
        [r.id for r in load_dataset("rag").records]


def test_shared_system_prompt_is_prepended_to_chat_records_only():
    ds = load_dataset("code").with_system_prompt("You are terse.")
    for r in ds.records:
        if r.messages is not None:
            assert r.messages[0] == {"role": "system", "content": "You are terse."}
        else:
            assert r.prompt is not None


def test_plain_jsonl_with_prompt_or_messages(tmp_path):
    f = tmp_path / "mine.jsonl"
    f.write_text(json.dumps({"prompt": "Once upon a time"}) + "\n\n"
                 + json.dumps({"messages": [{"role": "user", "content": "hi"}],
                               "category": "rag", "expected_output_tokens": 40}) + "\n")
    ds = load_dataset(f, default_category="code")
    got = [(r.category, r.expected_output_tokens) for r in ds.records]
    assert got == [("code", 256), ("rag", 40)]
    assert ds.records[0].prompt == "Once upon a time"


def test_sharegpt_array_and_jsonl(tmp_path):
    conv = {"id": "c1", "conversations": [
        {"from": "system", "value": "Be kind."}, {"from": "human", "value": "Who are you?"},
        {"from": "gpt", "value": "x" * 400}, {"from": "human", "value": "And then?"},
        {"from": "gpt", "value": "fine"}]}
    for text in (json.dumps([conv]), json.dumps(conv) + "\n"):
        f = tmp_path / "share.json"
        f.write_text(text)
        r = load_dataset(f).records[0]
        assert r.messages == ({"role": "system", "content": "Be kind."},
                              {"role": "user", "content": "Who are you?"})
        assert r.turns == ("And then?",)
        assert r.expected_output_tokens == 100  # the first answer, about 4 chars per token


def test_spec_bench_question_layout(tmp_path):
    f = tmp_path / "question.jsonl"
    f.write_text("\n".join(json.dumps(q) for q in [
        {"question_id": 1, "category": "mt_bench", "turns": ["Write a poem.", "Shorter."]},
        {"question_id": 2, "category": "rag", "turns": ["Given the text ... answer."]},
        {"question_id": 3, "category": "translation", "turns": ["Translate: hallo"]}]))
    recs = load_dataset(f).records
    assert [(r.id, r.category, r.turns) for r in recs] == [
        ("1", "chat", ("Shorter.",)), ("2", "rag", ()), ("3", "chat", ())]


@pytest.mark.parametrize("content, needle", [
    ("{not json\n", "not valid JSON"),
    ('{"text": "no prompt"}\n', "none of messages, prompt"),
    ('{"messages": []}\n', "non-empty list"),
    ('{"prompt": "a", "messages": [{"role": "user", "content": "b"}]}\n', "exactly one"),
])
def test_bad_files_name_the_line(tmp_path, content, needle):
    f = tmp_path / "bad.jsonl"
    f.write_text('{"prompt": "fine"}\n' + content)
    with pytest.raises(DatasetError, match=needle) as e:
        load_dataset(f)
    assert "bad.jsonl:2" in str(e.value)


def test_missing_file_is_a_readable_error():
    with pytest.raises(DatasetError, match="no such file"):
        load_dataset("/nonexistent/x.jsonl")


def test_record_round_trips_through_json():
    r = parse_record({"id": "a", "category": "chat", "messages": [{"role": "user", "content": "q"}],
                      "expected_output_tokens": 9, "turns": ["t2"], "source": "s", "license": "l"})
    assert parse_record(r.to_json()) == r
    assert isinstance(r, Record)


def test_prompt_length_filter_for_small_context_servers():
    rag = load_dataset("rag")
    short = rag.with_max_prompt_chars(2500)
    assert 0 < len(short) < len(rag) and all(r.prompt_chars <= 2500 for r in short.records)
    with pytest.raises(DatasetError, match="no record is shorter"):
        rag.with_max_prompt_chars(10)
