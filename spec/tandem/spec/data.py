"""What a job reads: `spec.dataset` (Dataset: the prompts, reference answers and, for kto, labelled completions)
and `spec.eval` (Eval: a held-out dataset evaluated on the live rollouts, how often, how many prompts and
samples).

Role: part of the job's shape, split from models.py. Callers: models.py (JobSpec), the trainer's loop
(`dataset`, `held_out`, `preflight`) through JobSpec.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field

from tandem.spec.strict_model import Base, Rule


class Images(Base):
    """What a row's pictures may be: how many per prompt, how large, and what happens to a larger one."""

    field: Annotated[str | None, Field(min_length=1, description="A column holding each row's pictures (a path, "
                                       "a list of paths relative to the dataset file, or a datasets Image "
                                       "feature), put before the prompt's text in its last user message; absent: "
                                       "pictures come only as image parts of the prompt's messages.")] = None
    max_per_prompt: Annotated[int, Field(ge=1, le=64, description="A row with more pictures than this is "
                                         "refused (counted; the job goes on).")] = 4
    max_pixels: Annotated[int, Field(ge=64, le=67_108_864, description="Width x height above which a picture "
                                     "is refused, or downscaled with resize: downscale.")] = 4_194_304
    resize: Literal["refuse", "downscale"] = Field(
        default="refuse", description="A picture over maxPixels: refuse its row, or downscale it (aspect "
        "kept) to fit.")


class Dataset(Base):
    """Prompts (a string or an OpenAI-style messages list per row), reference answers; kto: labelled completions."""

    path: Annotated[str, Field(min_length=1, description="Prompts: a .jsonl, .json (a list of objects) or "
                               ".parquet file, or a directory written by datasets' save_to_disk.")]
    format: Literal["auto", "jsonl", "json", "parquet", "datasets"] = Field(
        default="auto", description="auto: from the file's extension, or datasets for a directory.")
    split: Annotated[str, Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_]+(\.[A-Za-z0-9_]+)*$",
                                description="Split of a saved DatasetDict directory.")] = "train"
    prompt_field: Annotated[str, Field(min_length=1)] = "prompt"
    answer_field: Annotated[str, Field(min_length=1)] = "answer"
    chat_template: bool = Field(default=True, description="Render prompts with the tokenizer's chat template "
                                "and the generation prompt; false: plain strings as they are.")
    system_prompt: Annotated[str | None, Field(max_length=65_536, description="System message put before each "
                                               "prompt that does not start with one (needs chatTemplate).")] = None
    completion_field: Annotated[str | None, Field(min_length=1, description=(
        "kto: the field holding each row's completion, a string (or a list of one assistant message), trained "
        "as the assistant's reply to the rendered prompt and ended with the EOS token as the model's own "
        "completions are. kto only."))] = None
    label_field: Annotated[str | None, Field(min_length=1, description=(
        "kto: the field holding each row's label, true (a desirable completion) or false (undesirable); 1 and 0 "
        "are read as true and false. A row without a valid label is refused naming the file and row. kto "
        "only."))] = None
    images: Images | None = Field(default=None, description="Pictures in the prompts (vision-language models): "
                                  "image parts of a row's messages (OpenAI's image_url with a file://, data: or "
                                  "relative URL, or {type: image, path}), or a column of them; their limits. A "
                                  "row whose picture is missing, unreadable, of an unsupported format or over the "
                                  "limits is refused with its row number and reason, counted, and the job goes "
                                  "on; a dataset with no usable row fails at start.")
    rules = (
        Rule("self.chatTemplate || !has(self.systemPrompt)", "needs chatTemplate: true", ".systemPrompt",
             lambda d: d.chat_template or d.system_prompt is None),
        Rule("!has(self.images) || self.chatTemplate", "pictures go in a chat prompt: needs chatTemplate: true",
             ".images", lambda d: d.images is None or d.chat_template),
    )


class Eval(Base):
    """Held-out evaluation on the rollouts' live vLLM: iteration 0, every `every` iterations, and the end."""

    dataset: Dataset
    every: Annotated[int, Field(ge=1, le=1_000_000, description="Iterations between evaluations.")] = 10
    prompts: Annotated[int, Field(ge=1, le=100_000, description="The first N prompts of the dataset.")] = 256
    samples: Annotated[int, Field(ge=1, le=64, description="Samples per prompt (pass@k with k = samples).")] = 1
    temperature: Annotated[float, Field(ge=0, le=4)] = 0.0
    max_tokens: Annotated[int | None, Field(ge=1, le=131_072, description="Default: rollout.maxTokens.")] = None
    seed: Annotated[int, Field(ge=0, le=2**31 - 1)] = 0
