"""Prompt datasets (`tandem.sidecars.trainer.loop.data.dataset`): every file format read through `datasets`,
chat-template rendering with a real local tokenizer, and bad rows named by file, row and field.

The tokenizer is built here (byte-level BPE trained on a few sentences, ChatML template, BOS added by
its post-processor), saved and reloaded with AutoTokenizer as the trainer loads a model's tokenizer.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import datasets
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from pydantic import ValidationError

from tandem.sidecars.trainer.loop.data.dataset import Prompt, PromptDataset
from tandem.sidecars.trainer.loop.data.dataset_files import DatasetError
from tandem.spec.data import Dataset as DatasetSpec

CHATML = ("{{ bos_token }}{% for m in messages %}{% if m['role'] == 'tool' and m.get('name') == 'forbidden' %}"
          "{{ raise_exception('tool name not allowed') }}{% endif %}"
          "{{ '<|im_start|>' + m['role'] + '\n' + m['content'] + '<|im_end|>\n' }}{% endfor %}"
          "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}")
GEN = "<|im_start|>assistant\n"
CODE_TESTS = [{"input": "1 2", "output": "3"}, {"input": "2 2", "output": "4"}]
ROWS: list[dict[str, Any]] = [  # one Arrow type per column, so that parquet and save_to_disk hold them too
    {"prompt": [{"role": "user", "content": f"add the numbers {i}"}], "answer": CODE_TESTS[: 1 + i % 2]}
    for i in range(12)
]


def build_tokenizer(directory: Path, template: str | None = CHATML) -> Any:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import AutoTokenizer, PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    specials = ["<unk>", "<s>", "</s>", "<|im_start|>", "<|im_end|>"]
    corpus = [f"what is {a} plus {b}? add the numbers, you are careful" for a in range(30) for b in range(5)]
    tok.train_from_iterator(corpus, trainers.BpeTrainer(vocab_size=400, special_tokens=specials,
                                                        initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    bos = ("<s>", tok.token_to_id("<s>"))
    tok.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[bos])
    tok.decoder = decoders.ByteLevel()
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>", unk_token="<unk>")
    if template is not None:
        fast.chat_template = template
    fast.save_pretrained(directory)
    return AutoTokenizer.from_pretrained(directory)


@pytest.fixture(scope="module")
def chatml_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    directory = tmp_path_factory.mktemp("chatml")
    build_tokenizer(directory)
    return directory


@pytest.fixture(scope="module")
def tok(chatml_dir: Path) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(chatml_dir)


@pytest.fixture(scope="module")
def plain_tok(tmp_path_factory: pytest.TempPathFactory) -> Any:
    return build_tokenizer(tmp_path_factory.mktemp("plain"), template=None)


def jsonl(path: Path, rows: list[Any]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def load(path: Path, tokenizer: Any = None, **fields: Any) -> PromptDataset:
    return PromptDataset.load(DatasetSpec(path=str(path), **fields), tokenizer)


def write_all_formats(tmp: Path) -> dict[str, tuple[Path, dict[str, Any]]]:
    """ROWS in every format, with the spec fields each needs; the DatasetDict holds ROWS as 'test'."""
    (tmp / "list.json").write_text(json.dumps(ROWS))
    pq.write_table(pa.Table.from_pylist(ROWS), tmp / "rows.parquet")
    datasets.Dataset.from_list(ROWS).save_to_disk(str(tmp / "saved"))
    other = datasets.Dataset.from_list([{"prompt": [{"role": "user", "content": "other"}], "answer": CODE_TESTS}])
    datasets.DatasetDict({"train": other, "test": datasets.Dataset.from_list(ROWS)}).save_to_disk(str(tmp / "dict"))
    jsonl(tmp / "odd-name.txt", ROWS)
    return {"jsonl": (jsonl(tmp / "rows.jsonl", ROWS), {}), "json": (tmp / "list.json", {}),
            "parquet": (tmp / "rows.parquet", {}), "saved": (tmp / "saved", {}),
            "dict": (tmp / "dict", {"split": "test"}), "explicit": (tmp / "odd-name.txt", {"format": "jsonl"})}


def test_every_format_gives_the_same_prompts(tmp_path: Path, tok: Any) -> None:
    results = {name: load(path, tok, **fields).prompts for name, (path, fields) in write_all_formats(tmp_path).items()}
    expected = [tok.apply_chat_template(r["prompt"], add_generation_prompt=True, tokenize=False) for r in ROWS]
    for name, prompts in results.items():
        assert [p.text for p in prompts] == expected, name
        assert [p.answer for p in prompts] == [r["answer"] for r in ROWS], name  # lists of dicts, not str()-ed
        assert [p.question for p in prompts] == [r["prompt"][0]["content"] for r in ROWS], name
        assert [p.index for p in prompts] == list(range(len(ROWS))), name
    train = load(tmp_path / "dict", tok).prompts  # default split: train
    assert [p.question for p in train] == ["other"]


def test_chat_template_text_and_token_ids(tmp_path: Path, tok: Any) -> None:
    chat = [{"role": "user", "content": "what is 1 plus 1?"}, {"role": "assistant", "content": "2"},
            {"role": "user", "content": "and 2 plus 2?"}]
    rows: list[dict[str, Any]] = [{"prompt": "what is 3 plus 4?", "answer": 7}, {"prompt": chat, "answer": "4"}]
    prompts = load(jsonl(tmp_path / "p.jsonl", rows), tok).prompts
    first = tok.apply_chat_template([{"role": "user", "content": "what is 3 plus 4?"}], add_generation_prompt=True,
                                    tokenize=False)
    assert prompts[0].text == first == "<s><|im_start|>user\nwhat is 3 plus 4?<|im_end|>\n" + GEN
    assert prompts[1].text == tok.apply_chat_template(rows[1]["prompt"], add_generation_prompt=True, tokenize=False)
    assert all(p.text.endswith(GEN) for p in prompts)
    assert [p.question for p in prompts] == ["what is 3 plus 4?", "and 2 plus 2?"]
    assert [p.answer for p in prompts] == ["7", "4"]  # numbers as text, as before
    for p in prompts:  # the template writes BOS; the ids do not add a second one
        assert p.token_ids == tok(p.text, add_special_tokens=False)["input_ids"]
        assert p.token_ids is not None and p.token_ids.count(tok.bos_token_id) == 1
        assert tok.decode(p.token_ids) == p.text


def test_system_prompt(tmp_path: Path, tok: Any) -> None:
    rows = [{"prompt": "what is 3 plus 4?"},
            {"prompt": [{"role": "user", "content": "what is 5 plus 1?"}]},
            {"prompt": [{"role": "system", "content": "row's own"}, {"role": "user", "content": "what is 0 plus 0?"}]}]
    prompts = load(jsonl(tmp_path / "p.jsonl", rows), tok, system_prompt="be careful").prompts
    system = "<s><|im_start|>system\nbe careful<|im_end|>\n<|im_start|>user\n"
    assert prompts[0].text == system + "what is 3 plus 4?<|im_end|>\n" + GEN
    assert prompts[1].text == system + "what is 5 plus 1?<|im_end|>\n" + GEN
    assert "be careful" not in prompts[2].text and "row's own" in prompts[2].text
    assert prompts[2].question == "what is 0 plus 0?"
    assert DatasetSpec.model_validate({"path": "x", "systemPrompt": "s"}).system_prompt == "s"  # camelCase alias


def test_chat_template_off_and_missing(tmp_path: Path, tok: Any, plain_tok: Any) -> None:
    path = jsonl(tmp_path / "p.jsonl", [{"prompt": "what is 3 plus 4?", "answer": 7}])
    for tokenizer, fields in ((tok, {"chat_template": False}), (plain_tok, {})):
        (p,) = load(path, tokenizer, **fields).prompts
        assert p.text == p.question == "what is 3 plus 4?"
        assert p.token_ids == tokenizer("what is 3 plus 4?")["input_ids"]  # the tokenizer's default specials
        assert p.token_ids is not None and p.token_ids[0] == tokenizer.bos_token_id
    assert DatasetSpec.model_validate({"path": "x", "chatTemplate": False}).chat_template is False
    (p,) = load(path).prompts  # no tokenizer (the old API): text as it is, no ids
    assert (p.text, p.token_ids, p.answer) == ("what is 3 plus 4?", None, "7")
    messages = jsonl(tmp_path / "m.jsonl", [{"prompt": "a"}, {"prompt": [{"role": "user", "content": "b"}]}])
    for tokenizer, fields, why in ((tok, {"chat_template": False}, "dataset.chatTemplate is false"),
                                   (plain_tok, {}, "the tokenizer has no chat_template"),
                                   (None, {}, "no tokenizer was given")):
        with pytest.raises(DatasetError, match=rf"m.jsonl: row 2: field 'prompt' \(dataset.promptField\): "
                                               rf"a messages list needs the tokenizer's chat template \({why}\)"):
            load(messages, tokenizer, **fields)
    with pytest.raises(DatasetError, match=r"dataset.systemPrompt: needs .*no chat_template"):
        load(path, plain_tok, system_prompt="s")
    with pytest.raises(ValidationError, match="systemPrompt: needs chatTemplate"):
        DatasetSpec(path=str(path), chat_template=False, system_prompt="s")


def test_answers_keep_their_json_values(tmp_path: Path) -> None:
    answers = [42, "x", [1, "a"], {"tests": CODE_TESTS}, {"other": 1}, True, None]
    rows = [{"prompt": f"q{i}", "answer": a} if a is not None else {"prompt": f"q{i}"} for i, a in enumerate(answers)]
    (tmp_path / "a.json").write_text(json.dumps(rows))
    for path in (jsonl(tmp_path / "a.jsonl", rows), tmp_path / "a.json"):
        assert [p.answer for p in load(path).prompts] == ["42", "x", [1, "a"], {"tests": CODE_TESTS}, {"other": 1},
                                                          True, None]
    (p,) = load(jsonl(tmp_path / "n.jsonl", [{"q": "a"}]), prompt_field="q").prompts  # no answer column at all
    assert p.answer is None



def test_json_dates_stay_strings(tmp_path: Path, tok: Any) -> None:
    """Arrow's JSON reader would read ISO-8601 strings as timestamps; prompts and answers keep the text."""
    answer = {"input": "2020-01-01", "output": ["1999-12-31T10:00:00"]}
    rows = [{"prompt": [{"role": "user", "content": "2020-01-01"}], "answer": "2021-02-03", "note": "2020-01-02"},
            {"prompt": [{"role": "user", "content": "1999-12-31 10:00:00"}], "answer": "2021-02-04", "note": "x"}]
    prompts = load(jsonl(tmp_path / "d.jsonl", rows), tok).prompts
    assert [p.question for p in prompts] == ["2020-01-01", "1999-12-31 10:00:00"]
    assert [p.answer for p in prompts] == ["2021-02-03", "2021-02-04"]
    (tmp_path / "d.json").write_text(json.dumps([{"prompt": "2020-01-01", "answer": answer}]))
    (p,) = load(tmp_path / "d.json", tok).prompts
    assert (p.question, p.answer) == ("2020-01-01", answer)

BAD_ROWS = [
    ({"prompt": None}, r"field 'prompt' \(dataset.promptField\): missing or null"),
    ({"other": "x"}, r"field 'prompt' \(dataset.promptField\): missing or null"),
    ({"prompt": 5}, r"must be a string or a non-empty list of messages, got number"),
    ({"prompt": []}, r"must be a string or a non-empty list of messages, got a list"),
    ({"prompt": "  "}, r"empty string"),
    ({"prompt": ["hi"]}, r"message 1: must be an object with role and content, got string"),
    ({"prompt": [{"role": "bot", "content": "hi"}]}, r"message 1: role 'bot' is not one of system, user"),
    ({"prompt": [{"role": "user", "content": ["a"]}]},
     r"message 1: content must be a string or a list of text and image parts, got a list"),
    ({"prompt": [{"role": "user"}]},
     r"message 1: content must be a string or a list of text and image parts, got null"),
    ({"prompt": [{"role": "system", "content": "s"}]}, r"no user message"),
    ({"prompt": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}]},
     r"the last message is from 'assistant'"),
    ({"prompt": [{"role": "user", "content": "q"}, {"role": "tool", "content": "t", "name": "forbidden"}]},
     r"the tokenizer's chat template failed: tool name not allowed"),
]


@pytest.mark.parametrize(("row", "message"), BAD_ROWS)
def test_bad_rows_name_file_row_and_field(tmp_path: Path, tok: Any, row: dict[str, Any], message: str) -> None:
    good = {"prompt": [{"role": "user", "content": "fine"}], "answer": "1"}
    path = jsonl(tmp_path / "bad.jsonl", [good, good, row, good])
    with pytest.raises(DatasetError, match=rf"bad.jsonl: row 3: (field 'prompt' \(dataset.promptField\): )?{message}"):
        load(path, tok)


def test_bad_parquet_rows(tmp_path: Path, tok: Any) -> None:
    rows = [{"messages": [{"role": "user", "content": f"q{i}"}]} for i in range(9)]
    rows[6]["messages"][0]["role"] = "robot"
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "data.parquet")
    with pytest.raises(DatasetError, match=r"data.parquet: row 7: field 'messages' \(dataset.promptField\): "
                                           r"message 1: role 'robot'"):
        load(tmp_path / "data.parquet", tok, prompt_field="messages")
    with pytest.raises(DatasetError, match=r"data.parquet: row 1: field 'prompt' \(dataset.promptField\) missing; "
                                           r"the columns are messages"):
        load(tmp_path / "data.parquet", tok)


def test_bad_files_and_formats(tmp_path: Path) -> None:
    jsonl(tmp_path / "good.jsonl", [{"prompt": "a"}])
    (tmp_path / "broken.jsonl").write_text('{"prompt": "a"}\n{"prompt": "b",\n')
    (tmp_path / "broken.json").write_text('[{"prompt": "a"},')
    (tmp_path / "broken.parquet").write_text("not parquet")
    (tmp_path / "prompts.csv").write_text("prompt\na\n")
    (tmp_path / "plain-dir").mkdir()
    datasets.DatasetDict({"train": datasets.Dataset.from_list([{"prompt": "a"}])}).save_to_disk(str(tmp_path / "dd"))
    cases = [
        ("missing.jsonl", {}, r"dataset.path: .*missing.jsonl does not exist"),
        ("broken.jsonl", {}, r"broken.jsonl: line 2: not valid JSON"),
        ("broken.json", {}, r"broken.json: line 1: not valid JSON"),
        ("broken.parquet", {}, r"broken.parquet: cannot read as parquet: "),
        ("prompts.csv", {}, r"dataset.format: cannot tell the format of .*prompts.csv .*set dataset.format"),
        ("plain-dir", {}, r"plain-dir: a directory must be written by datasets' save_to_disk"),
        ("plain-dir", {"format": "parquet"}, r"dataset.format: parquet needs a file; .*plain-dir is a directory"),
        ("good.jsonl", {"format": "datasets"}, r"dataset.format: datasets needs a directory"),
        ("good.jsonl", {"split": "test"}, r"dataset.split: 'test' applies to a DatasetDict directory"),
        ("dd", {"split": "test"}, r"dataset.split: .*dd has no split 'test' \(it has train\)"),
    ]
    for name, fields, message in cases:
        with pytest.raises(DatasetError, match=message):
            load(tmp_path / name, **fields)


def test_batch_is_deterministic_and_head_keeps_file_order(tmp_path: Path) -> None:
    path = jsonl(tmp_path / "p.jsonl", [{"prompt": f"q{i}", "answer": i} for i in range(10)])
    a, b = load(path), PromptDataset.load(DatasetSpec(path=str(path)), seed=0)
    assert [p.index for p in a.batch(3, 4)] == [p.index for p in b.batch(3, 4)]
    assert sorted(p.index for it in range(5) for p in a.batch(it, 2)) == list(range(10))  # one epoch covers all
    assert [p.index for p in PromptDataset(a.prompts, seed=1).batch(0, 10)] != [p.index for p in a.batch(0, 10)]
    assert [p.question for p in a.head(3)] == ["q0", "q1", "q2"] and len(a.head(100)) == len(a) == 10
    assert Prompt("t", None, 0).question == "t"


def test_offline_and_no_hf_cache_writes(tmp_path: Path, chatml_dir: Path) -> None:
    """In a fresh process with the hub off, sockets refused and an empty HF_HOME: all formats load and
    nothing is left in HF_HOME or in the temporary directory."""
    write_all_formats(tmp_path)
    hf_home, scratch = tmp_path / "hf", tmp_path / "scratch"
    hf_home.mkdir()
    scratch.mkdir()
    script = f"""
import socket
def refuse(*a, **k): raise OSError("network used")
socket.socket.connect = refuse
socket.create_connection = refuse
from tandem.sidecars.trainer.loop.data.dataset import PromptDataset
from tandem.spec.data import Dataset
from transformers import AutoTokenizer
tok = AutoTokenizer.from_pretrained({str(chatml_dir)!r})
for path, fields in [("rows.jsonl", {{}}), ("list.json", {{}}), ("rows.parquet", {{}}), ("saved", {{}}),
                     ("dict", {{"split": "test"}})]:
    assert len(PromptDataset.load(Dataset(path={str(tmp_path)!r} + "/" + path, **fields), tok)) == {len(ROWS)}
print("ok")
"""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "TMP"))}
    env.update(HF_HOME=str(hf_home), HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1", TMPDIR=str(scratch),
               PYTHONPATH=os.pathsep.join(sys.path))
    done = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr[-3000:]
    assert list(hf_home.rglob("*")) == [] and list(scratch.iterdir()) == []
