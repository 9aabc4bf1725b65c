"""Prompt dataset of a job: read once, rendered with the model's chat template, sampled per iteration.

Callers: the trainer's loop (`tandem.sidecars.trainer.loop.start`, `.driver`):
`PromptDataset.load(spec.dataset, tokenizer)` once, `batch(iteration, size)` every iteration,
`head(n)` for an evaluation set (its first n prompts in file order).

Files (`dataset.format`: JSON Lines, JSON, Parquet, a `datasets` directory) are read by the `datasets`
library (`dataset_files`).

Rows are numbered from 1 in file order. `dataset.promptField` holds a string or an OpenAI-style
messages list `[{role: system|user|assistant|tool, content: str}, ...]` that has a user message and
ends with a user or tool message; other non-null keys of a message (`name`, ...) are passed on to the
template. `dataset.answerField` is optional and may hold any JSON value: numbers become strings as
before (the answer matcher compares text; a JSON column of ints and floats arrives as floats, so
`42` reads `42.0`, which the matcher still equals to 42), while strings, booleans, lists and objects
(code tests) are kept as the Python values. A bad row raises DatasetError naming file, row and field.

Rendering (`Prompt.text`, what the rollout engine is sent):
- `chatTemplate` on and the tokenizer has a chat template: a string becomes one user message;
  `systemPrompt` is put first unless the row's messages already start with a system message (the
  row's own wins); `apply_chat_template(messages, add_generation_prompt=True, tokenize=False)`.
  `Prompt.token_ids` are the ids of that text without added special tokens (the template writes BOS
  where the model wants it).
- `chatTemplate` off, no tokenizer, or a tokenizer without a chat template: strings are used as they
  are (`token_ids` with the tokenizer's default special tokens, None without a tokenizer). A messages
  row is then an error, and so is `systemPrompt`: joining turns by hand would train the model on a
  format it never sees in use.
`Prompt.question` is the plain string or the content of the last user message (what a reward may
see as "the prompt").

KTO (`dataset.completionField` and `labelField`): every row also holds a completion and its label,
read and tokenized as the assistant's reply by `labelled` into `PromptDataset.labelled` (one per row,
in the order of `prompts`); a row without a valid one is a DatasetError naming file, row and field.
"""

from __future__ import annotations

import random
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tandem.sidecars import picture_files as images
from tandem.sidecars.trainer.loop.data import labelled as kto_rows
from tandem.sidecars.trainer.loop.data.dataset_files import DatasetError, detect_format, read
from tandem.sidecars.trainer.loop.data.labelled import Labelled
from tandem.spec.data import Dataset as DatasetSpec
from tandem.spec.data import Images as DatasetImages

ROLES = ("system", "user", "assistant", "tool")
_ENCODE_CHUNK = 1024  # texts per tokenizer call


@dataclass(frozen=True)
class Prompt:
    text: str  # what the model sees: the chat template applied when there is one
    answer: Any  # the answer field: str (numbers as text), or a list/dict/bool as read; None if absent
    index: int  # row in file order, from 0
    token_ids: list[int] | None = None  # ids of `text` when a tokenizer was given
    question: str = ""  # the plain prompt or last user message; defaults to `text`
    messages: list[dict[str, Any]] | None = None  # the chat messages `text` renders (multi-turn rollouts)
    images: tuple[Any, ...] = ()  # its pictures (RGB PIL images, in the order of their placeholders in `text`)

    def __post_init__(self) -> None:
        if not self.question:
            object.__setattr__(self, "question", self.text)

    @property
    def model_input(self) -> str | list[int]:
        """What vLLM is asked to continue: the token ids (chat template applied, special tokens exactly
        once), or the text when no tokenizer rendered it."""
        return self.token_ids if self.token_ids is not None else self.text

    @property
    def chat(self) -> list[dict[str, Any]]:
        """The conversation a multi-turn rollout opens with: the row's messages, or the prompt as one."""
        return self.messages or [{"role": "user", "content": self.text}]

    @property
    def fields(self) -> dict[str, Any]:
        """What a multi-turn environment gets of the row (its reset and reward)."""
        return {"question": self.question, "answer": self.answer, "index": self.index}


def pictures_of(prompts: Sequence[Prompt]) -> dict[str, Any]:
    """The `images=` keyword of a generate call for `prompts`: each prompt's pictures, or nothing when none has
    any (a text job's generators need not take the keyword)."""
    return {"images": [list(p.images) for p in prompts]} if any(p.images for p in prompts) else {}


class PromptDataset:
    def __init__(self, prompts: list[Prompt], seed: int = 0, labelled: list[Labelled] | None = None,
                 refused: list[tuple[int, str]] | None = None):
        if not prompts:
            raise DatasetError("dataset is empty")
        self.refused = refused or []  # (row number from 1, why) of the rows whose pictures could not be used
        if labelled is not None and len(labelled) != len(prompts):
            raise DatasetError(f"{len(labelled)} labelled completions for {len(prompts)} prompts")
        self.prompts = prompts
        self.seed = seed
        self.labelled = labelled  # KTO: row i's completion and label, beside prompts[i]

    def __len__(self) -> int:
        return len(self.prompts)

    @classmethod
    def load(cls, spec: DatasetSpec, tokenizer: Any | None = None, seed: int = 0) -> PromptDataset:
        """Read `spec.path`, check every row, render the prompts (see the module docstring)."""
        path = Path(spec.path)
        kto = {f: name for f, name in ((spec.completion_field, "completionField"), (spec.label_field, "labelField"))
               if f is not None}
        column = spec.images.field if spec.images is not None else None
        table = read(path, detect_format(path, spec.format), spec.split,
                      (spec.prompt_field, spec.answer_field, *kto, *([column] if column else [])))
        columns = list(table.column_names)
        for field, name in ((spec.prompt_field, "promptField"), *kto.items(), *([(column, "images.field")] if column
                                                                                 else [])):
            if field not in columns:
                raise DatasetError(f"{path}: row 1: field {field!r} (dataset.{name}) missing; "
                                   f"the columns are {', '.join(columns) or 'none'}")
        has_answer = spec.answer_field in columns
        rows: list[dict[str, Any]] = table.select_columns(
            list(dict.fromkeys([spec.prompt_field, *([spec.answer_field] if has_answer else []), *kto,
                                *([column] if column else [])]))).to_list()
        if not rows:
            raise DatasetError(f"{path}: no rows")
        render = _Renderer(spec, path, tokenizer)
        texts: list[str] = []
        questions: list[str] = []
        chats: list[list[dict[str, Any]] | None] = []
        pics: list[tuple[Any, ...]] = []
        kept: list[int] = []  # rows in file order, from 0, whose pictures (if any) could be used
        refused: list[tuple[int, str]] = []
        for n, row in enumerate(rows, 1):
            try:
                value, found = render.pictures(n, row[spec.prompt_field], row.get(column) if column else None)
            except images.Refused as e:
                refused.append((n, str(e)))
                continue
            text, question = render(n, value)
            texts.append(text)
            questions.append(question)
            chats.append(render.messages(n, value) if render.templated else None)
            pics.append(found)
            kept.append(n - 1)
        if not kept:
            raise DatasetError(f"{path}: no usable row: all {len(rows)} were refused; row {refused[0][0]}: "
                               f"{refused[0][1]}")
        ids: list[list[int] | None] = [None] * len(texts)
        if tokenizer is not None:
            ids = list(_encode(tokenizer, texts, special=not render.templated))
        table_rows = zip(kept, texts, questions, ids, chats, pics, strict=True)
        return cls([Prompt(text, _answer(rows[i].get(spec.answer_field)), i, token_ids, question, chat, found)
                    for i, text, question, token_ids, chat, found in table_rows], seed,
                   _labelled(spec, path, rows, texts, render) if kto else None, refused)

    def batch(self, iteration: int, size: int) -> list[Prompt]:
        """The prompts of an iteration: a seeded shuffle per epoch, so a resumed run sees the same ones."""
        out: list[Prompt] = []
        start = iteration * size
        while len(out) < size:
            epoch, offset = divmod(start + len(out), len(self.prompts))
            order = list(range(len(self.prompts)))
            random.Random(self.seed * 1_000_003 + epoch).shuffle(order)
            take = order[offset: offset + size - len(out)]
            out += [self.prompts[i] for i in take]
        return out

    def head(self, n: int) -> list[Prompt]:
        """The first n prompts in file order (all of them when there are fewer): an evaluation set."""
        if n < 0:
            raise ValueError(f"head: n must be >= 0, got {n}")
        return self.prompts[:n]


class _Renderer:
    """One row's prompt value → (text the model sees, the question)."""

    def __init__(self, spec: DatasetSpec, path: Path, tokenizer: Any | None):
        self.spec, self.path = spec, path
        self.tokenizer: Any = tokenizer
        if not spec.chat_template:
            self.why_not = "dataset.chatTemplate is false"
        elif tokenizer is None:
            self.why_not = "no tokenizer was given"
        elif not getattr(tokenizer, "chat_template", None):
            self.why_not = "the tokenizer has no chat_template"
        else:
            self.why_not = ""
        self.templated = not self.why_not
        if spec.system_prompt is not None and not self.templated:
            raise DatasetError(f"dataset.systemPrompt: needs the tokenizer's chat template ({self.why_not})")

    def pictures(self, n: int, value: Any, column: Any) -> tuple[Any, tuple[Any, ...]]:
        """(the prompt value with each image part as `{"type": "image"}`, the row's pictures); `images.Refused`
        names the picture that cannot be used. A row without pictures is returned as it is."""
        where = f"{self.path}: row {n}: field {self.spec.prompt_field!r} (dataset.promptField)"
        prompt = _prompt_value(value, where)
        limits = self.spec.images or DatasetImages()
        if column is not None and limits.field is not None:
            prompt = images.with_column(self.messages(n, prompt), column, limits.field)
        if isinstance(prompt, str) or not any(isinstance(m["content"], list) for m in prompt):
            return prompt, ()
        found, messages = images.pictures(prompt, self.path.parent, images.Limits(
            limits.max_per_prompt, limits.max_pixels, limits.resize))
        return messages, tuple(found)

    def messages(self, n: int, value: Any) -> list[dict[str, Any]]:
        """The row's prompt as chat messages, the system prompt first where the job sets one."""
        prompt = _prompt_value(value, f"{self.path}: row {n}: field {self.spec.prompt_field!r} (dataset.promptField)")
        messages = [{"role": "user", "content": prompt}] if isinstance(prompt, str) else prompt
        if self.spec.system_prompt is not None and messages[0]["role"] != "system":
            messages = [{"role": "system", "content": self.spec.system_prompt}, *messages]
        return messages

    def __call__(self, n: int, value: Any, reply: str | None = None) -> tuple[str, str]:
        """(text, question); with `reply` (KTO) the text is the conversation ending with it as the
        assistant's turn (templated only)."""
        where = f"{self.path}: row {n}: field {self.spec.prompt_field!r} (dataset.promptField)"
        prompt = _prompt_value(value, where)
        if not self.templated:
            if isinstance(prompt, list):
                raise DatasetError(f"{where}: a messages list needs the tokenizer's chat template ({self.why_not})")
            return prompt, prompt
        messages = self.messages(n, value)
        question = images.text_of(next(m["content"] for m in reversed(messages) if m["role"] == "user"))
        turn = [] if reply is None else [{"role": "assistant", "content": reply}]
        try:
            text = self.tokenizer.apply_chat_template([*messages, *turn], add_generation_prompt=reply is None,
                                                      tokenize=False)
        except Exception as e:  # jinja's raise_exception, undefined variables, ...
            raise DatasetError(f"{where}: the tokenizer's chat template failed: {e}") from None
        if not isinstance(text, str):
            raise DatasetError(f"{where}: the chat template gave {type(text).__name__}, not text")
        return text, question


def _labelled(spec: DatasetSpec, path: Path, rows: list[dict[str, Any]], texts: list[str],
              render: _Renderer) -> list[Labelled]:
    """Each row's completion (tokenized as the reply to its rendered prompt) and label."""
    if spec.completion_field is None or spec.label_field is None:
        raise DatasetError("dataset.completionField and dataset.labelField: a labelled dataset needs both")
    out: list[Labelled] = []
    for n, (row, text) in enumerate(zip(rows, texts, strict=True), 1):
        where = f"{path}: row {n}: field"
        try:
            desirable = kto_rows.label(row.get(spec.label_field))
        except ValueError as e:
            raise DatasetError(f"{where} {spec.label_field!r} (dataset.labelField): {e}") from None
        try:
            reply = kto_rows.completion(row.get(spec.completion_field))
            ids = None
            if render.tokenizer is not None:
                conversation = render(n, row[spec.prompt_field], reply)[0] if render.templated else None
                ids = kto_rows.reply_ids(render.tokenizer, text, conversation, reply)
        except DatasetError:
            raise
        except ValueError as e:
            raise DatasetError(f"{where} {spec.completion_field!r} (dataset.completionField): {e}") from None
        out.append(Labelled(reply, desirable, ids))
    return out


def _prompt_value(value: Any, where: str) -> str | list[dict[str, Any]]:
    """A non-empty string, or a checked messages list (null-valued keys dropped)."""
    if isinstance(value, str):
        if not value.strip():
            raise DatasetError(f"{where}: empty string")
        return value
    if value is None:
        raise DatasetError(f"{where}: missing or null")
    if not isinstance(value, list) or not value:
        raise DatasetError(f"{where}: must be a string or a non-empty list of messages, got {_kind(value)}")
    messages: list[dict[str, Any]] = []
    for i, message in enumerate(value, 1):
        at = f"{where}: message {i}"
        if not isinstance(message, dict):
            raise DatasetError(f"{at}: must be an object with role and content, got {_kind(message)}")
        role, content = message.get("role"), message.get("content")
        if not isinstance(role, str) or role not in ROLES:
            raise DatasetError(f"{at}: role {role!r} is not one of {', '.join(ROLES)}")
        if not isinstance(content, str) and not _parts(content):
            raise DatasetError(f"{at}: content must be a string or a list of text and image parts, got "
                               f"{_kind(content)}")
        messages.append({k: v for k, v in message.items() if v is not None})
    if not any(m["role"] == "user" for m in messages):
        raise DatasetError(f"{where}: no user message")
    if messages[-1]["role"] not in ("user", "tool"):
        raise DatasetError(f"{where}: the last message is from {messages[-1]['role']!r}; a prompt ends with a "
                           "user or tool message")
    return messages


def _parts(content: Any) -> bool:
    """Whether `content` is a non-empty list of OpenAI-style content parts (text, image or image_url)."""
    return isinstance(content, list) and bool(content) and all(
        images.is_image_part(p) or (isinstance(p, dict) and p.get("type") == "text" and isinstance(p.get("text"), str))
        for p in content)


def _answer(value: Any) -> Any:
    """Numbers as text (as the answer matcher compares them); anything else as read."""
    if isinstance(value, int | float) and not isinstance(value, bool):
        return str(value)
    return value


def _encode(tokenizer: Any, texts: list[str], special: bool) -> Iterator[list[int]]:
    for start in range(0, len(texts), _ENCODE_CHUNK):
        for ids in tokenizer(texts[start: start + _ENCODE_CHUNK], add_special_tokens=special)["input_ids"]:
            yield [int(i) for i in ids]


def _kind(value: Any) -> str:
    """The JSON name of a value's type, for error messages."""
    names = ((type(None), "null"), (bool, "boolean"), (int | float, "number"), (str, "string"), (list, "a list"),
             (dict, "an object"))
    return next((name for cls, name in names if isinstance(value, cls)), type(value).__name__)
