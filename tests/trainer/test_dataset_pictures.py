"""A vision-language job's dataset (data/dataset.py with data/images.py): pictures reach the prompts, a row whose
picture cannot be used is refused with its row number and reason while the others load, and a dataset of refused
rows only fails at start naming its file.

The tokenizer and chat template are the VLM demo's (build.py on tests/rollout_engine/tiny_model.py's Qwen2): its
template renders an image part as the model's `<image>` placeholder. Bad rows are real files: a missing picture, a
file cut short, bytes that are no picture, two pictures where one is allowed.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest
from PIL import Image

from tandem.sidecars.trainer.loop.data.dataset import PromptDataset
from tandem.sidecars.trainer.loop.data.dataset_files import DatasetError
from tandem.sidecars.vlm_demo import build
from tandem.spec.data import Dataset

sys.path.insert(0, str(Path(__file__).parents[1] / "rollout_engine"))
import tiny_model  # noqa: E402


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory: pytest.TempPathFactory) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_model.save_vlm(tmp_path_factory.mktemp("pictures-tok")))


def picture(path: Path, colour: tuple[int, int, int] = (200, 30, 30)) -> str:
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.new("RGB", (16, 16), colour).save(path)
    return path.name


def ask(*names: str) -> dict[str, Any]:
    parts = [{"type": "image", "path": f"pics/{n}"} for n in names]
    return {"messages": [{"role": "user", "content": [*parts, {"type": "text", "text": "What colour?"}]}],
            "answer": "red"}


def write(path: Path, rows: list[dict[str, Any]]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_bad_pictures_refuse_their_rows_and_the_rest_load(tmp_path: Path, tokenizer: Any) -> None:
    good = picture(tmp_path / "pics" / "good.png")
    (tmp_path / "pics" / "cut.png").write_bytes((tmp_path / "pics" / good).read_bytes()[:60])
    (tmp_path / "pics" / "junk.png").write_bytes(b"not a picture at all")
    rows = [ask(good), ask("missing.png"), ask("cut.png"), ask("junk.png"), ask(good, good), ask(good)]
    spec = Dataset(path=str(write(tmp_path / "d.jsonl", rows)), prompt_field="messages", answer_field="answer",
                   images={"maxPerPrompt": 1})
    data = PromptDataset.load(spec, tokenizer)
    assert [p.index for p in data.prompts] == [0, 5]  # rows 1 and 6, numbered from 0
    assert [n for n, _ in data.refused] == [2, 3, 4, 5]
    reasons = dict(data.refused)
    assert "missing.png: no such file" in reasons[2]
    assert "not a readable picture" in reasons[3] and "not a readable picture" in reasons[4]
    assert "more than 1 pictures (dataset.images.maxPerPrompt)" in reasons[5]
    for p in data.prompts:
        assert len(p.images) == 1 and p.images[0].getpixel((0, 0)) == (200, 30, 30)
        assert p.token_ids is not None and p.token_ids.count(tokenizer.convert_tokens_to_ids(build.IMAGE_TOKEN)) == 1
        assert p.question == "What colour?"


def test_a_dataset_of_refused_rows_fails_at_start_naming_its_file(tmp_path: Path, tokenizer: Any) -> None:
    path = write(tmp_path / "all-bad.jsonl", [ask("gone.png"), ask("gone-too.png")])
    spec = Dataset(path=str(path), prompt_field="messages", answer_field="answer")
    with pytest.raises(DatasetError, match=r"all-bad.jsonl: no usable row: all 2 were refused; row 1: .*gone.png"):
        PromptDataset.load(spec, tokenizer)


def test_an_images_column_puts_its_pictures_before_the_question(tmp_path: Path, tokenizer: Any) -> None:
    name = picture(tmp_path / "pics" / "blue.png", (20, 40, 220))
    rows = [{"prompt": "What colour?", "picture": f"pics/{name}", "answer": "blue"},
            {"prompt": "And this one?", "picture": [f"pics/{name}", f"pics/{name}"], "answer": "blue"},
            {"prompt": "Bad?", "picture": 7, "answer": "blue"}]
    spec = Dataset(path=str(write(tmp_path / "c.jsonl", rows)), prompt_field="prompt", answer_field="answer",
                   images={"field": "picture"})
    data = PromptDataset.load(spec, tokenizer)
    assert [len(p.images) for p in data.prompts] == [1, 2]
    assert data.prompts[0].images[0].getpixel((3, 3)) == (20, 40, 220)
    image = tokenizer.convert_tokens_to_ids(build.IMAGE_TOKEN)
    ids = data.prompts[1].token_ids
    assert ids is not None and ids.count(image) == 2
    text = data.prompts[1].text
    assert text.rindex(build.IMAGE_TOKEN) < text.index("And this one?")  # the pictures before the question
    [(n, why)] = data.refused
    assert n == 3 and "field 'picture' (dataset.images.field): not a picture path or image" in why
