"""What the trainer checks before it starts its ranks: the model directories and every prompt's length.

Role: a job that cannot run stops at once, with one line naming the file and the spec field, instead of
a traceback after the Megatron engine is built or a rollout engine that vLLM leaves FAILED mid-run.
Caller: `python -m tandem.sidecars.trainer` (`__main__.main`), once per pod before the ranks start; a
`PreflightError` is logged and left as the container's termination message (`startup.refuse`).

- `spec.model.path` (config.json and tokenizer files), `spec.reference.path` (config.json) and
  `spec.algorithm.distillation.teacher` (config.json and tokenizer files): `tandem.spec.model_dir.check`;
  the reference and the teacher are scored by swapping their weights into the trainer's own engine
  (`reference.ReferenceWeights`), so their config must give the model's shape (`model_dir.SHAPE_KEYS`).
- `spec.dataset` and, for its first `spec.eval.prompts` rows, `spec.eval.dataset`: every row is
  rendered and tokenized as the driver sends it (`PromptDataset.load` with the model's tokenizer and chat
  template: `Prompt.model_input`) and must leave room for one generated token in the rollout's context
  length (`model_dir.context_length`: `rollout.maxModelLen`, by default `rollout.maxTokens` + 1024 at
  most the model's max_position_embeddings); a picture counts as the image tokens vLLM expands its placeholder
  to (config.json's `image_seq_length`; for Qwen2.5-VL, whose pictures are grids of patches, the count its image
  processor gives for the picture's size: `picture_tokens`). A longer row is refused, not skipped: skipping would train
  (or evaluate) on another set of prompts than the file's, biased to the short ones, with nothing but a
  count to show for it. The message names the file, the first such row (numbered from 1, as
  `DatasetError`s are), its token count, the limit, the fields that set it, and how many rows in all.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from tandem.sidecars.picture_files import PerImage, tokens_per_picture
from tandem.sidecars.trainer.loop.data.dataset import Prompt, PromptDataset
from tandem.sidecars.trainer.loop.data.dataset_files import DatasetError
from tandem.spec import model_dir
from tandem.spec.data import Dataset
from tandem.spec.models import JobSpec

ROWS_NAMED = 5  # rows listed after the first too-long one


class PreflightError(ValueError):
    """The job cannot start; str() is one line naming the file and the spec field."""


def check(spec: JobSpec) -> None:
    """Every check of the module docstring; raises PreflightError at the first problem."""
    problems = model_dir.job_problems(spec, missing_ok=False)
    if problems:
        field, message = problems[0]
        raise PreflightError(f"{field}: {message}")
    config = model_dir.read_config(spec.model.path, "spec.model.path")
    for field, path in model_dir.swapped_dirs(spec):
        problem = model_dir.shape_mismatch(config, model_dir.read_config(path, field))
        if problem:
            raise PreflightError(f"{field}: {path} is scored in the trainer's engine in place of the model's weights, "
                                 f"so it must have the shape of spec.model.path: {problem}")
    limit = model_dir.context_length(spec.rollout, config)
    tokenizer = load_tokenizer(spec.model.path)
    sets: list[tuple[Dataset, str, int | None]] = [(spec.dataset, "spec.dataset", None)]
    if spec.eval is not None:
        sets.append((spec.eval.dataset, "spec.eval.dataset", spec.eval.prompts))
    for dataset, field, rows in sets:
        try:
            prompts = PromptDataset.load(dataset, tokenizer).prompts
        except DatasetError as e:
            raise PreflightError(str(e)) from None
        check_lengths(prompts[:rows], limit, dataset.path, field, model_dir.context_fields(spec.rollout),
                      per_image=picture_tokens(spec.model.path, config))


def picture_tokens(path: str, config: dict[str, Any]) -> PerImage:
    """`picture_files.tokens_per_picture`, its error a PreflightError naming spec.model.path."""
    try:
        return tokens_per_picture(path, config)
    except ValueError as e:
        raise PreflightError(f"spec.model.path: {e}") from None


def load_tokenizer(path: str) -> Any:
    """The model's tokenizer, as the trainer renders prompts with it; PreflightError naming model.path."""
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(path)
    except Exception as e:  # noqa: BLE001 - transformers raises OSError, ValueError, KeyError, ... here
        reason = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise PreflightError(f"spec.model.path: cannot load the tokenizer of {path}: {reason}") from None


def check_lengths(prompts: Sequence[Prompt], limit: int, path: str, field: str, limit_fields: str,
                  per_image: PerImage = 1) -> None:
    """PreflightError when a prompt has `limit` tokens or more (no room for one generated token); a picture
    counts as the `per_image` image tokens its placeholder becomes (`picture_tokens`)."""
    too_long = [p for p in prompts if token_count(p, per_image) >= limit]
    if not too_long:
        return
    first = too_long[0]
    others = ", ".join(str(p.index + 1) for p in too_long[1:ROWS_NAMED + 1])
    more = "" if len(too_long) == 1 else (f"; {len(too_long)} rows in all (also rows {others}"
                                          + (", ..." if len(too_long) > ROWS_NAMED + 1 else "") + ")")
    raise PreflightError(
        f"{path}: row {first.index + 1} ({field}.path): the prompt is {token_count(first, per_image)} tokens as "
        f"sent (chat template applied{_pictures_note(per_image) if first.images else ''}), "
        f"which leaves no room for a generated token in the rollout's context "
        f"length of {limit} tokens ({limit_fields}){more}. Raise spec.rollout.maxModelLen (up to the "
        f"model's max_position_embeddings) or shorten those prompts")


def _pictures_note(per_image: PerImage) -> str:
    return f", each picture its {per_image} image tokens" if isinstance(per_image, int) else \
        ", each picture its image tokens"


def token_count(prompt: Prompt, per_image: PerImage = 1) -> int:
    """Tokens the rollout engine holds for `prompt` (its token ids; characters without a tokenizer), each picture's
    placeholder as the `per_image` tokens vLLM expands it to (or `per_image(picture)`)."""
    counts = [per_image if isinstance(per_image, int) else per_image(p) for p in prompt.images]
    return len(prompt.model_input) + sum(n - 1 for n in counts)
