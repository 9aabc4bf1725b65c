"""KTO's labelled datasets (`dataset.completionField`, `labelField`): completions tokenized as the
model's reply to the rendered prompt (ChatML: the text after the generation prompt, up to and with
<|im_end|>; a plain prompt: the completion and EOS), labels read as true/false or 1/0, and bad rows
named by file, row and field. Also `LabelledSource`: an iteration's rows in the seeded order, as
samples followed by their KL probes, and the spec's rules for the two fields."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

# a real byte-level BPE tokenizer with a ChatML template, built and saved as a model's would be
from test_dataset import build_tokenizer, jsonl

from tandem.sidecars.trainer.loop.data.dataset import PromptDataset
from tandem.sidecars.trainer.loop.data.dataset_files import DatasetError
from tandem.sidecars.trainer.loop.rollout.sources import LabelledSource
from tandem.spec.data import Dataset as DatasetSpec
from tandem.spec.load import SpecError, parse_job

KTO_FIELDS = {"completionField": "completion", "labelField": "label"}


def load(path: Path, tokenizer: Any = None, **fields: Any) -> PromptDataset:
    return PromptDataset.load(DatasetSpec.model_validate({"path": str(path), **KTO_FIELDS, **fields}), tokenizer)


def rows(n: int) -> list[dict[str, Any]]:
    return [{"prompt": [{"role": "user", "content": f"what is {i} plus 1?"}], "completion": f"you are {i + 1}",
             "label": i % 2 == 0} for i in range(n)]


@pytest.fixture(scope="module")
def tok(tmp_path_factory: pytest.TempPathFactory) -> Any:
    return build_tokenizer(tmp_path_factory.mktemp("chatml"))


@pytest.fixture(scope="module")
def plain_tok(tmp_path_factory: pytest.TempPathFactory) -> Any:
    return build_tokenizer(tmp_path_factory.mktemp("plain"), template=None)


def test_completions_are_the_reply_after_the_generation_prompt(tmp_path: Path, tok: Any) -> None:
    data = load(jsonl(tmp_path / "k.jsonl", rows(4)), tok)
    assert data.labelled is not None and [x.desirable for x in data.labelled] == [True, False, True, False]
    first = data.labelled[0]
    assert first.text == "you are 1"
    end = tok.convert_tokens_to_ids("<|im_end|>")
    assert first.token_ids == tok("you are 1", add_special_tokens=False)["input_ids"] + [end]
    # prompt + completion is what the template renders for the conversation, up to the end of the turn
    whole = tok.apply_chat_template([{"role": "user", "content": "what is 0 plus 1?"},
                                     {"role": "assistant", "content": "you are 1"}], tokenize=False)
    assert tok.decode([*(data.prompts[0].token_ids or []), *(first.token_ids or [])]) == whole.rstrip("\n")


def test_plain_prompts_end_the_completion_with_eos(tmp_path: Path, plain_tok: Any) -> None:
    path = jsonl(tmp_path / "p.jsonl", [{"prompt": "what is 2 plus 1?", "completion": " you are 3", "label": 1},
                                        {"prompt": "what is 3 plus 1?", "completion": [
                                            {"role": "assistant", "content": " you are 5"}], "label": 0}])
    data = load(path, plain_tok)
    assert data.labelled is not None and [x.desirable for x in data.labelled] == [True, False]
    assert data.labelled[0].token_ids == plain_tok(" you are 3", add_special_tokens=False)["input_ids"] + [
        plain_tok.eos_token_id]
    assert data.labelled[1].text == " you are 5"  # TRL's conversational form: one assistant message
    assert load(path).labelled is not None and load(path).labelled[0].token_ids is None  # type: ignore[index]


@pytest.mark.parametrize(("change", "field", "message"), [
    ({"label": "yes"}, "'label' (dataset.labelField)", "must be true .desirable. or false .*got 'yes'"),
    ({"label": 2}, "'label' (dataset.labelField)", "got 2"),
    ({"label": None}, "'label' (dataset.labelField)", "missing or null"),
    ({"completion": ""}, "'completion' (dataset.completionField)", "empty string"),
    ({"completion": None}, "'completion' (dataset.completionField)", "missing or null"),
    ({"completion": 7}, "'completion' (dataset.completionField)", "must be a string"),
    ({"completion": [{"role": "user", "content": "hi"}]}, "'completion' (dataset.completionField)", "assistant"),
])
def test_bad_rows_name_file_row_and_field(tmp_path: Path, tok: Any, change: dict[str, Any], field: str,
                                          message: str) -> None:
    data = rows(4)
    data[2].update(change)
    with pytest.raises(DatasetError, match=rf"bad.jsonl: row 3: field {re.escape(field)}: .*{message}"):
        load(jsonl(tmp_path / "bad.jsonl", data), tok)


def test_missing_columns_and_a_lone_field(tmp_path: Path, tok: Any) -> None:
    path = jsonl(tmp_path / "k.jsonl", [{k: v for k, v in r.items() if k != "label"} for r in rows(2)])
    with pytest.raises(DatasetError, match=r"k.jsonl: row 1: field 'label' \(dataset.labelField\) missing; "
                                           r"the columns are prompt, completion"):
        load(path, tok)
    with pytest.raises(DatasetError, match="needs both"):
        PromptDataset.load(DatasetSpec(path=str(path), completion_field="completion"), tok)


def test_labelled_source_takes_seeded_batches_with_their_kl_probes(tmp_path: Path, tok: Any) -> None:
    data = load(jsonl(tmp_path / "k.jsonl", rows(6)), tok)
    source = LabelledSource(data, rows_per_iteration=4)
    samples, stats = source.next(1)
    examples, probes = samples[:4], samples[4:]
    order = [p.index for p in data.batch(1, 4)]  # the order prompts are taken in
    assert data.labelled is not None
    for s, i in zip(examples, order, strict=True):
        assert s.prompt_ids == data.prompts[i].token_ids and s.completion_ids == data.labelled[i].token_ids
        assert s.desirable == (i % 2 == 0) and s.reward == (1.0 if i % 2 == 0 else 0.0) and not s.kl_probe
    assert all(p.kl_probe for p in probes)
    assert [p.completion_ids for p in probes] == [examples[(k + 1) % 4].completion_ids for k in range(4)]
    assert stats == {"desirable_examples": sum(i % 2 == 0 for i in order),
                     "undesirable_examples": sum(i % 2 == 1 for i in order)}
    with pytest.raises(DatasetError, match="completionField"):
        LabelledSource(PromptDataset.load(DatasetSpec(path=str(tmp_path / "k.jsonl")), tok), 4)


def job(algorithm: str, **dataset: str) -> dict[str, Any]:
    return {"apiVersion": "tandem.dev/v1alpha1", "kind": "RLHFJob", "metadata": {"name": "j"}, "spec": {
        "model": {"path": "/m"}, "dataset": {"path": "/d.jsonl", **dataset}, "rewards": [{"type": "answerMatch"}],
        "algorithm": {"name": algorithm}}}


@pytest.mark.parametrize(("doc", "field", "words"), [
    (job("kto"), "spec.dataset.completionField", "labelled completions"),
    (job("kto", completionField="c"), "spec.dataset.labelField", "label"),
    (job("grpo", completionField="c"), "spec.dataset.completionField", "kto only"),
    (job("dpo", labelField="l"), "spec.dataset.labelField", "kto only"),
    ({**job("kto", **KTO_FIELDS), "spec": {**job("kto", **KTO_FIELDS)["spec"], "eval": {
        "dataset": {"path": "/t.jsonl", "labelField": "l"}}}}, "spec.eval.dataset", "do not apply"),
    ({**job("kto", **KTO_FIELDS), "spec": {**job("kto", **KTO_FIELDS)["spec"], "rollout": {
        "partial": {"tokenBudget": 8}}}}, "spec.rollout.partial", "kto generates no"),
])
def test_spec_rules_name_the_field(doc: dict[str, Any], field: str, words: str) -> None:
    with pytest.raises(SpecError) as err:
        parse_job(doc, "job.yaml")
    assert field in err.value.fields and words in str(err.value), str(err.value)
    parse_job(job("kto", **KTO_FIELDS), "job.yaml")  # both fields, kto: valid
