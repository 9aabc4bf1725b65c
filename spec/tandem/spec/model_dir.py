"""A job's model directories checked before anything loads them, and the rollout's context length.

Role: a model directory that cannot be used (no config.json, one that cannot be read or is not a JSON
object, no tokenizer files) becomes one line naming the file and the spec field, instead of a
traceback from transformers or vLLM deep inside a sidecar that then crash-loops. Callers:
`tandem validate` and `tandem run` (`tandem.cli.main`; validate passes over a directory that does not
exist here, as a cluster's exists only in its pods), the trainer and rollout sidecars at start
(`tandem.sidecars.trainer.loop.preflight`, `tandem.sidecars.rollout.__main__`), which exit with that line
as the container's termination message.

`context_length` is vLLM's max_model_len for the job (prompt + completion tokens): `rollout.maxModelLen`,
by default `rollout.maxTokens` + `PROMPT_ROOM`, at most the model's max_position_embeddings. The
rollout sidecar starts vLLM with it; the trainer checks every dataset row against it.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from tandem.spec.models import JobSpec
from tandem.spec.rollout import Rollout

CONFIG = "config.json"
# Any one of these lets transformers (and vLLM) build the tokenizer: a fast tokenizer, a tokenizer
# config (a custom class), SentencePiece models, BPE or WordPiece vocabularies.
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "spiece.model", "vocab.json",
                   "vocab.txt")
PROMPT_ROOM = 1024  # default context beyond rollout.maxTokens
DEFAULT_POSITIONS = 4096  # a config without max_position_embeddings


class ModelDirError(ValueError):
    """A model directory that cannot be used; str() is one line: `<field>: <what, naming the file>`."""

    def __init__(self, field: str, message: str) -> None:
        self.field = field
        super().__init__(f"{field}: {message}")


def read_config(path: str | Path, field: str) -> dict[str, Any]:
    """`path`/config.json as a dict, or ModelDirError naming the file and `field` (e.g. spec.model.path)."""
    directory = Path(path)
    if not directory.exists():
        raise ModelDirError(field, f"{directory} does not exist")
    if not directory.is_dir():
        raise ModelDirError(field, f"{directory} is not a directory (a HuggingFace model directory)")
    file = directory / CONFIG
    if not file.exists():
        raise ModelDirError(field, f"{file} is missing (a HuggingFace model directory has one)")
    try:
        config = json.loads(file.read_bytes().decode("utf-8"))
    except OSError as e:
        raise ModelDirError(field, f"cannot read {file}: {e.strerror or e}") from None
    except UnicodeDecodeError:
        raise ModelDirError(field, f"{file} is not UTF-8 text") from None
    except json.JSONDecodeError as e:
        raise ModelDirError(field, f"{file} is not valid JSON (line {e.lineno} column {e.colno}: {e.msg})") from None
    if not isinstance(config, dict):
        raise ModelDirError(field, f"{file} is not a JSON object")
    return config


def check(path: str | Path, field: str, *, tokenizer: bool) -> dict[str, Any]:
    """`read_config`, and with `tokenizer` at least one of TOKENIZER_FILES beside it; returns the config."""
    config = read_config(path, field)
    if tokenizer and not any((Path(path) / name).is_file() for name in TOKENIZER_FILES):
        raise ModelDirError(field, f"{path} has no tokenizer files (none of {', '.join(TOKENIZER_FILES)})")
    return config


def job_problems(spec: JobSpec, *, missing_ok: bool) -> list[tuple[str, str]]:
    """(field, message) for each unusable model directory of the job: model.path (config and tokenizer),
    reference.path (config) and algorithm.distillation.teacher (config and tokenizer). `missing_ok`: a
    directory that does not exist here is not checked."""
    dirs = [("spec.model.path", spec.model.path, True)]
    if spec.reference.path is not None:
        dirs.append(("spec.reference.path", spec.reference.path, False))
    if spec.algorithm.distillation is not None:
        dirs.append(("spec.algorithm.distillation.teacher", spec.algorithm.distillation.teacher, True))
    out: list[tuple[str, str]] = []
    for field, path, tokenizer in dirs:
        if missing_ok and not Path(path).exists():
            continue
        try:
            check(path, field, tokenizer=tokenizer)
        except ModelDirError as e:
            out.append((field, str(e).removeprefix(f"{field}: ")))
    return out


SHAPE_KEYS = ("model_type", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
              "num_key_value_heads", "head_dim", "vocab_size", "tie_word_embeddings", "num_local_experts")


def swapped_dirs(spec: JobSpec) -> list[tuple[str, str]]:
    """(field, path) of the model dirs whose weights the trainer swaps into its own engine to score
    samples: reference.path and algorithm.distillation.teacher."""
    out = []
    if spec.reference.path is not None:
        out.append(("spec.reference.path", spec.reference.path))
    if spec.algorithm.distillation is not None:
        out.append(("spec.algorithm.distillation.teacher", spec.algorithm.distillation.teacher))
    return out


def shape_mismatch(model: dict[str, Any], other: dict[str, Any]) -> str | None:
    """The first SHAPE_KEYS entry where `other`'s config differs from `model`'s, said in words; None if alike."""
    for key in SHAPE_KEYS:
        if model.get(key) != other.get(key):
            return f"config.json's {key} is {other.get(key)!r} where the model has {model.get(key)!r}"
    return None


def context_length(rollout: Rollout, config: dict[str, Any]) -> int:
    """vLLM's max_model_len: rollout.maxModelLen, else min(maxTokens + PROMPT_ROOM, max_position_embeddings)."""
    if rollout.max_model_len is not None:
        return rollout.max_model_len
    text = config.get("text_config")  # a vision-language model's: its language model's
    positions = (text if isinstance(text, dict) else config).get("max_position_embeddings", DEFAULT_POSITIONS)
    return min(int(positions), rollout.max_tokens + PROMPT_ROOM)


def context_fields(rollout: Rollout) -> str:
    """Which spec fields set `context_length`, for messages."""
    if rollout.max_model_len is not None:
        return "spec.rollout.maxModelLen"
    return (f"spec.rollout.maxModelLen unset: spec.rollout.maxTokens {rollout.max_tokens} + {PROMPT_ROOM}, "
            "at most the model's max_position_embeddings")
