"""Generate the RLHFJob CustomResourceDefinition from the pydantic models.

Role: the one source of the CRD. `tandem crd` writes it to manifests/crd/ and helm/tandem/crds/;
tests/test_crd.py fails when either committed copy differs from what this module generates.
The conversion inlines $refs, turns Optional into nullable, Literals into enums, keeps
defaults/bounds/patterns, and emits each model's `Rule`s as `x-kubernetes-validations`.
"""

from __future__ import annotations

from typing import Any

import yaml
from pydantic import BaseModel

from tandem.spec import (
    ckpt_engine,
    data,
    models,
    pod_containers,
    pod_scheduling,
    podtemplate,
    presets,
    rewards,
    rollout,
    status,
    strict_model,
)
from tandem.spec.models import GROUP, IMMUTABLE_FIELDS, KIND, PLURAL, VERSION

_KEEP = {"type", "description", "default", "enum", "minimum", "maximum", "exclusiveMinimum",
         "exclusiveMaximum", "minLength", "maxLength", "pattern", "minItems", "maxItems", "minProperties",
         "maxProperties"}


def _rules_by_title() -> dict[str, list[dict[str, str]]]:
    out: dict[str, list[dict[str, str]]] = {}
    # where the job's models are declared
    for module in (models, rewards, podtemplate, pod_containers, pod_scheduling, rollout, data, ckpt_engine):
        for obj in vars(module).values():
            if isinstance(obj, type) and issubclass(obj, strict_model.Base) and obj.rules:
                out[obj.__name__] = [_validation(r) for r in obj.rules]
    return out


def _cel_string(text: str) -> str:
    return "'" + text.replace("\\", "\\\\").replace("'", "\\'") + "'"


def _validation(r: strict_model.Rule) -> dict[str, str]:
    """A Rule as an x-kubernetes-validations entry; one a preset may cause names the preset, as offline."""
    message = f"{r.field.lstrip('.')}: {r.message}"
    out = {"rule": r.cel, "message": message, "fieldPath": r.field}
    if r.preset_field:
        out["messageExpression"] = (f"{presets.cel_filled(r.preset_field, r.algorithm)} ? {_cel_string(message)} + "
                                    f"{presets.cel_note(r.preset_field, r.algorithm)} : {_cel_string(message)}")
    return out


def _convert(node: dict[str, Any], defs: dict[str, Any], rules: dict[str, list[dict[str, str]]]) -> dict[str, Any]:
    if "$ref" in node:
        name = node["$ref"].split("/")[-1]
        merged = {**defs[name], **{k: v for k, v in node.items() if k != "$ref"}}
        return _convert(merged, defs, rules)
    if "anyOf" in node:  # Optional[X] -> X, nullable
        variants = [v for v in node["anyOf"] if v.get("type") != "null"]
        if len(variants) != 1:
            raise ValueError(f"unsupported union in schema: {node}")
        base = _convert(variants[0], defs, rules)
        base.update({k: v for k, v in node.items() if (k in _KEEP and k != "type") or k.startswith("x-kubernetes-")})
        base["nullable"] = True
        if node.get("x-tandem-preset"):
            base.pop("default", None)
        if base.get("default", 0) is None:
            del base["default"]
        return base
    out: dict[str, Any] = {k: v for k, v in node.items() if k in _KEEP or k.startswith("x-kubernetes-")}
    if node.get("x-tandem-preset"):  # algorithm.preset fills it when absent: no API-server default
        out.pop("default", None)
    if "const" in node:
        out["enum"] = [node["const"]]
        out.setdefault("type", "string")
    if isinstance(node.get("additionalProperties"), dict):  # a map (labels, nodeSelector)
        out["additionalProperties"] = _convert(node["additionalProperties"], defs, rules)
    elif node.get("type") == "object" or "properties" in node:
        out["type"] = "object"
        props = node.get("properties", {})
        out["properties"] = {k: _convert(v, defs, rules) for k, v in props.items()}
        for k, v in out["properties"].items():  # let the API server default nested objects too
            if (v.get("type") == "object" and k not in node.get("required", ()) and "default" not in v
                    and not v.get("nullable")  # an Optional object stays absent unless given
                    and "additionalProperties" not in v):  # so does an empty map
                v["default"] = {}
        if node.get("required"):
            out["required"] = list(node["required"])
        title = node.get("title", "")
        if title in rules:
            out["x-kubernetes-validations"] = rules[title]
    if node.get("type") == "array":
        out["items"] = _convert(node["items"], defs, rules)
    if out.get("x-kubernetes-int-or-string"):  # an integer or a string, as Kubernetes' quantities: no type
        out.pop("type", None)
    if out.get("type") == "number" and isinstance(out.get("default"), int):
        out["default"] = float(out["default"])
    for bound, plain in (("exclusiveMinimum", "minimum"), ("exclusiveMaximum", "maximum")):
        if bound in out:  # JSON Schema 2020 number -> OpenAPI v3.0 boolean flag
            out[plain], out[bound] = out[bound], True
    return out


def _fill_object_defaults(node: dict[str, Any]) -> None:
    """Replace each nested object's `default: {}` by its fully defaulted value (bottom-up).

    The API server checks every default against the schema's CEL rules without applying the nested
    defaults first, so `{}` fails rules such as `self.globalBatchSize % self.microBatchSize == 0`.
    """
    for prop in node.get("properties", {}).values():
        if prop.get("type") != "object":
            continue
        _fill_object_defaults(prop)
        if prop.get("default") == {}:
            prop["default"] = {k: v["default"] for k, v in prop.get("properties", {}).items() if "default" in v}


def spec_schema() -> dict[str, Any]:
    raw = models.JobSpec.model_json_schema(by_alias=True, mode="validation")
    schema = _convert(raw, raw.get("$defs", {}), _rules_by_title())
    _fill_object_defaults(schema)
    for name in IMMUTABLE_FIELDS:
        prop = schema["properties"][name]
        prop.setdefault("x-kubernetes-validations", []).append(
            {"rule": "self == oldSelf", "message": f"{name} is immutable; create a new RLHFJob instead"})
    return schema


def _status_schema() -> dict[str, Any]:
    raw = status.JobStatus.model_json_schema(by_alias=True, mode="serialization")
    return _convert(raw, raw.get("$defs", {}), {})


# `kubectl scale rlhfjob/NAME --replicas=N` (and an HPA) sizes the rollout-only pool.
SCALE = {"specReplicasPath": ".spec.rolloutOnlyReplicas", "statusReplicasPath": ".status.rolloutOnlyReplicas",
         "labelSelectorPath": ".status.rolloutOnlySelector"}


def build_crd() -> dict[str, Any]:
    columns = [
        {"name": "Phase", "type": "string", "jsonPath": ".status.phase"},
        {"name": "Reason", "type": "string", "jsonPath": ".status.reason",
         "description": "Why the job is in its phase (a waiting container's reason, PodCreateRefused, ...)"},
        {"name": "Iteration", "type": "integer", "jsonPath": ".status.iteration"},
        {"name": "Reward", "type": "number", "jsonPath": ".status.rewardMean"},
        {"name": "Eval", "type": "number", "jsonPath": ".status.eval.passAt1"},
        {"name": "Sync(s)", "type": "number", "jsonPath": ".status.lastSyncSeconds"},
        {"name": "Progress", "type": "number", "jsonPath": ".status.progress.percent",
         "description": "Iterations done, in percent"},
        {"name": "ETA", "type": "string", "jsonPath": ".status.progress.eta",
         "description": "Estimated time until the last iteration"},
        {"name": "Restarts", "type": "integer", "jsonPath": ".status.restarts", "priority": 1},
        {"name": "Replaced", "type": "integer", "jsonPath": ".status.rolloutReplacements", "priority": 1,
         "description": "Rollout-only pods replaced alone"},
        {"name": "Version", "type": "integer", "jsonPath": ".status.weightVersion", "priority": 1},
        {"name": "Mismatch", "type": "number", "jsonPath": ".status.mismatchKl", "priority": 1,
         "description": "Rollout vs trainer: mean KL (k3) per model token, latest iteration"},
        {"name": "Algorithm", "type": "string", "jsonPath": ".status.algorithm", "priority": 1,
         "description": "The algorithm as it runs, its preset expanded"},
        {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
    ]
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": f"{PLURAL}.{GROUP}"},
        "spec": {
            "group": GROUP,
            "names": {"kind": KIND, "listKind": f"{KIND}List", "plural": PLURAL, "singular": KIND.lower(),
                      "shortNames": ["rlhf", "rj"], "categories": ["tandem"]},
            "scope": "Namespaced",
            "versions": [{
                "name": VERSION, "served": True, "storage": True,
                "subresources": {"status": {}, "scale": SCALE},
                "additionalPrinterColumns": columns,
                "schema": {"openAPIV3Schema": {
                    "type": "object",
                    "required": ["spec"],
                    "properties": {
                        "apiVersion": {"type": "string"}, "kind": {"type": "string"},
                        "metadata": {"type": "object"},
                        "spec": spec_schema(),
                        "status": _status_schema(),
                    },
                }},
            }],
        },
    }


class _NoAliases(yaml.SafeDumper):
    """Writes shared subtrees (a class used twice, a filled default) in full, without YAML anchors."""

    def ignore_aliases(self, data: Any) -> bool:
        return True


def render(obj: BaseModel | dict[str, Any] | None = None) -> str:
    """The CRD as YAML text, with a header saying it is generated."""
    body = yaml.dump(build_crd() if obj is None else obj, Dumper=_NoAliases, sort_keys=False, width=120)
    return "# Generated by `tandem crd` from spec/tandem/spec/models.py. Do not edit by hand.\n" + body
