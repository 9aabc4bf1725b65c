"""The algorithm presets as data, and the same expansion written twice: in Python and in CEL.

Role: `PRESETS` (what each published recipe sets) and `NAME_DEFAULTS` (what each algorithm name
takes where the job and the preset leave a field out) are expanded in Python by
`tandem.spec.algorithm.Algorithm` before its fields are validated, so every Python rule sees the
effective values. The API server stores the job as written, the preset unexpanded, so the CRD's
rules read the same effective values through the CEL helpers here: `cel_set` (a field the job or its
preset sets), `cel_value` (a field's value as the expansion gives it) and `cel_filled` (the preset,
not the job, set it: the rule's message then names the preset, `messageExpression`). A preset applies
to grpo only (a preset on another name is refused by its own rule and fills nothing), and a field
given as null counts as left out, in Python as in CEL (the API server's `has()` is false for null).
Callers: `tandem.spec.algorithm` (expansion, Algorithm's rules), `tandem.spec.models` (JobSpec's rules
over algorithm fields), `tandem.spec.strict_model` and `tandem.spec.crd` (the preset note of a refusal).
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic.config import JsonDict

Preset = Literal["dapo", "dr_grpo", "gspo", "rloo", "reinforce_pp", "cispo"]
PRESET_MARK: JsonDict = {"x-tandem-preset": True}  # crd.py: no schema default (the preset's to fill)

PRESETS: dict[str, dict[str, Any]] = {
    # DAPO (Yu et al. 2025): clip-higher, token-level loss, no KL, soft overlong punishment
    "dapo": {"clip": 0.2, "clip_high": 0.28, "kl_coef": 0.0, "loss_agg": "token-mean",
             "overlong": {"penalty": 1.0}, "dynamic_sampling": {"max_rounds": 3}},
    # Dr. GRPO (Liu et al. 2025): no std normalisation, no length normalisation, no KL
    "dr_grpo": {"norm_std": False, "loss_agg": "seq-mean-token-sum-norm", "kl_coef": 0.0},
    # GSPO (Zheng et al. 2025): sequence-level ratio, clip range 3e-4 / 4e-4, sequence-mean loss
    "gspo": {"policy_loss": "gspo", "clip": 3e-4, "clip_high": 4e-4, "loss_agg": "seq-mean-token-mean",
             "kl_coef": 0.0},
    # RLOO (Ahmadian et al. 2024): leave-one-out baseline, KL as a reward penalty
    "rloo": {"advantage": "rloo", "kl_penalty": "reward", "kl_estimator": "k1"},
    # REINFORCE++ (Hu 2025): token returns with the KL penalty in the rewards, whitened over the batch
    "reinforce_pp": {"advantage": "reinforce_pp", "kl_penalty": "reward", "kl_estimator": "k1"},
    # CISPO (MiniMax-M1 2025): clipped importance weight as a coefficient, no lower bound, token-mean
    "cispo": {"policy_loss": "cispo", "clip": 1.0, "clip_high": 0.28, "loss_agg": "token-mean"},
}
NAME_DEFAULTS: dict[str, dict[str, Any]] = {
    "grpo": {"advantage": "grpo", "kl_estimator": "k3", "kl_penalty": "loss"},
    "ppo": {"advantage": "gae", "kl_estimator": "k1", "kl_penalty": "reward"},
    "dpo": {},
    "kto": {},
}
PRESETABLE = ("kl_coef", "clip", "clip_high", "policy_loss", "advantage", "norm_std", "loss_agg", "kl_estimator",
              "kl_penalty", "overlong", "mask_truncated", "dynamic_sampling")


def camel(name: str) -> str:
    head, *rest = name.split("_")
    return head + "".join(p.title() for p in rest)


def snake(name: str) -> str:
    return "".join(f"_{c.lower()}" if c.isupper() else c for c in name)


def given(data: dict[str, Any], name: str) -> bool:
    """The job gives field `name` (snake_case) a value, under either spelling; null is no value."""
    return data.get(name) is not None or data.get(camel(name)) is not None


def expand(data: dict[str, Any]) -> tuple[dict[str, Any], list[str]]:
    """`data` with the preset's values, then the name's defaults, filled in where the job gives none, and
    the fields (snake_case) the preset filled."""
    out = dict(data)
    name = out.get("name", "grpo")
    preset = out.get("preset") if name == "grpo" else None
    filled: list[str] = []
    for key, value in (PRESETS.get(preset, {}) if isinstance(preset, str) else {}).items():
        if not given(out, key):
            out.pop(camel(key), None)
            out[key] = value
            filled.append(key)
    for key, value in (NAME_DEFAULTS.get(name, {}) if isinstance(name, str) else {}).items():
        if not given(out, key):
            out.pop(camel(key), None)
            out[key] = value
    return out, filled


def setters(field: str) -> list[str]:
    """The presets that set `field` (camelCase)."""
    return [p for p, values in PRESETS.items() if snake(field) in values]


def _literal(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"
    if isinstance(value, float):
        return repr(value)
    raise ValueError(f"no CEL literal for {value!r}")


def _by_preset(a: str, presets: list[str]) -> str:
    return f"(has({a}.preset) && {a}.name == 'grpo' && {a}.preset in [{', '.join(map(_literal, presets))}])"


def cel_filled(field: str, a: str = "self") -> str:
    """CEL: the preset, not the job, sets `field` of the algorithm object `a`."""
    presets = setters(field)
    return f"(!has({a}.{field}) && {_by_preset(a, presets)})" if presets else "false"


def cel_set(field: str, a: str = "self") -> str:
    """CEL: the job or its preset gives `field` (an optional object or value) of the algorithm `a`."""
    presets = setters(field)
    return f"(has({a}.{field}) || {_by_preset(a, presets)})" if presets else f"has({a}.{field})"


def cel_value(field: str, default: Any, a: str = "self") -> str:
    """CEL: `field`'s effective value (the job's, else its preset's, else its name's, else `default`)."""
    key = snake(field)
    chain = _literal(default)
    for name, values in NAME_DEFAULTS.items():
        if key in values:
            chain = f"({a}.name == {_literal(name)} ? {_literal(values[key])} : {chain})"
    for preset in reversed(setters(field)):
        chain = f"({_by_preset(a, [preset])} ? {_literal(PRESETS[preset][key])} : {chain})"
    return f"(has({a}.{field}) ? {a}.{field} : {chain})"


def note(preset: str | None, field: str) -> str:
    """What a refusal adds when the preset, not the job, set the algorithm field `field` it rests on."""
    return f" (algorithm.preset {preset} sets {field})"


def cel_note(field: str, a: str = "self") -> str:
    """CEL string expression of `note`, the preset read from the algorithm object `a`."""
    return f"' (algorithm.preset ' + {a}.preset + ' sets {field})'"
