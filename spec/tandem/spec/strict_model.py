"""The base every RLHFJob model class derives from, and the `Rule` type of cross-field rules.

Role: camelCase wire names, unknown fields refused, and each class's `rules` checked in Python
(`tandem validate`, `tandem run`, the operator) while `tandem.spec.crd` emits the same rules as CEL
(`x-kubernetes-validations`, enforced by the API server). Callers: every model module of `tandem.spec` (the
model classes), `tandem.spec.crd` (finds the rules by class name in the modules it lists).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Annotated, Any, ClassVar

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, model_validator
from pydantic.alias_generators import to_camel

QUANTITY = r"^[0-9]+(\.[0-9]+)?(m|Ki|Mi|Gi|Ti|k|M|G|T)?$"
INT_OR_STRING = {"x-kubernetes-int-or-string": True}  # crd.py: no type; Kubernetes' own for quantities
ENDPOINT = r"^https?://[A-Za-z0-9.\-\[\]:]+(:[0-9]+)?$"
IMAGE = r"^[a-z0-9][a-z0-9._\-/:@]*$"
ABS_PATH = r"^(/[A-Za-z0-9_][A-Za-z0-9._\-]*)+$"  # absolute, no trailing slash, no '..' or hidden parts
DNS_LABEL = r"^[a-z]([-a-z0-9]*[a-z0-9])?$"
DNS_SUBDOMAIN = r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$"


def int_as_string(value: Any) -> Any:
    """An integer quantity (`cpu: 8`) as the string Kubernetes reads it as; any other value as it is."""
    return str(value) if isinstance(value, int) and not isinstance(value, bool) else value


# A Kubernetes quantity: written as an integer (8) or a string ("8", "500m", "64Gi"), as the API server's
# int-or-string takes it; read as a string.
Quantity = Annotated[str, Field(pattern=QUANTITY, max_length=64, json_schema_extra={**INT_OR_STRING, "minimum": 0}),
                     BeforeValidator(int_as_string)]


@dataclass(frozen=True)
class Rule:
    """A cross-field rule: CEL for the API server, a Python predicate for offline checks."""

    cel: str
    message: str
    field: str  # relative JSON path of the field blamed, e.g. ".tensorParallel"
    check: Callable[[Any], bool]
    # An algorithm field (camelCase) that algorithm.preset may have set: a refusal then names the preset
    # (Python: `Base.preset_note`; the CRD: a messageExpression over the CEL object `algorithm`).
    preset_field: str = ""
    algorithm: str = "self"


class Base(BaseModel):
    model_config = ConfigDict(
        alias_generator=to_camel, populate_by_name=True, extra="forbid", validate_default=True,
        frozen=False, strict=True,  # as the API server: "8" is no integer, "false" no boolean (an int is a number)
    )
    rules: ClassVar[tuple[Rule, ...]] = ()

    def preset_note(self, rule: Rule) -> str:
        """What a refusal by `rule` adds when a preset, not the job, set its `preset_field` (Algorithm, JobSpec)."""
        return ""

    @model_validator(mode="after")
    def _check_rules(self) -> Base:
        for rule in type(self).rules:
            if not rule.check(self):
                raise ValueError(f"{rule.field.lstrip('.')}: {rule.message}{self.preset_note(rule)}")
        return self
