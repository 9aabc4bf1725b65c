"""Where a job's pods run: core/v1 tolerations and affinity, typed to the depth the scheduler reads.

Role: the shapes of `spec.podTemplate.spec.tolerations` and `.affinity` (and the same fields of
`rolloutOnly.spec`), in Kubernetes' own field names, with the rules the API server would apply to them.
Callers: `tandem.spec.podtemplate` (`PodSpecOverride`, `SchedulingOverride`); the operator's builders copy them
into the pods (`tandem.operator.manifests.pod_template`).
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field

from tandem.spec.pod_fields import LABEL_VALUE, Key, Labels, Name, Values
from tandem.spec.strict_model import Base, Rule


class Toleration(Base):
    """core/v1 Toleration."""

    key: Annotated[str | None, Field(max_length=317)] = None
    operator: Literal["Exists", "Equal"] = "Equal"
    value: Annotated[str | None, Field(pattern=LABEL_VALUE, max_length=63)] = None
    effect: Literal["NoSchedule", "PreferNoSchedule", "NoExecute"] | None = None
    toleration_seconds: Annotated[int | None, Field(ge=0, description="NoExecute only.")] = None
    rules = (
        Rule("self.operator == 'Exists' || has(self.key)", "an empty key needs operator Exists", ".key",
             lambda t: t.operator == "Exists" or bool(t.key)),
        Rule("self.operator != 'Exists' || !has(self.value) || self.value == ''", "operator Exists takes no value",
             ".value", lambda t: t.operator != "Exists" or not t.value),
        Rule("!has(self.tolerationSeconds) || (has(self.effect) && self.effect == 'NoExecute')",
             "applies only to effect NoExecute", ".tolerationSeconds",
             lambda t: t.toleration_seconds is None or t.effect == "NoExecute"),
    )


class NodeSelectorRequirement(Base):
    key: Key
    operator: Literal["In", "NotIn", "Exists", "DoesNotExist", "Gt", "Lt"]
    values: Values = Field(default_factory=list)
    rules = (Rule("self.operator in ['In', 'NotIn'] ? has(self.values) && size(self.values) > 0 : "
                  "self.operator in ['Gt', 'Lt'] ? has(self.values) && size(self.values) == 1 : "
                  "!has(self.values) || size(self.values) == 0",
                  "In and NotIn need values, Gt and Lt one, Exists and DoesNotExist none", ".values",
                  lambda r: (len(r.values) > 0 if r.operator in ("In", "NotIn") else
                             len(r.values) == (1 if r.operator in ("Gt", "Lt") else 0))),)


class NodeSelectorTerm(Base):
    match_expressions: Annotated[list[NodeSelectorRequirement], Field(max_length=32)] = Field(default_factory=list)
    match_fields: Annotated[list[NodeSelectorRequirement], Field(max_length=32)] = Field(default_factory=list)


class NodeSelector(Base):
    node_selector_terms: Annotated[list[NodeSelectorTerm], Field(min_length=1, max_length=32)]


class PreferredSchedulingTerm(Base):
    weight: Annotated[int, Field(ge=1, le=100)]
    preference: NodeSelectorTerm


class NodeAffinity(Base):
    required_during_scheduling_ignored_during_execution: NodeSelector | None = None
    preferred_during_scheduling_ignored_during_execution: Annotated[
        list[PreferredSchedulingTerm], Field(max_length=32)] = Field(default_factory=list)


class LabelSelectorRequirement(Base):
    key: Key
    operator: Literal["In", "NotIn", "Exists", "DoesNotExist"]
    values: Values = Field(default_factory=list)
    rules = (Rule("self.operator in ['In', 'NotIn'] ? has(self.values) && size(self.values) > 0 : "
                  "!has(self.values) || size(self.values) == 0",
                  "In and NotIn need values; Exists and DoesNotExist take none", ".values",
                  lambda r: bool(r.values) == (r.operator in ("In", "NotIn"))),)


class LabelSelector(Base):
    match_labels: Labels = Field(default_factory=dict)
    match_expressions: Annotated[list[LabelSelectorRequirement], Field(max_length=32)] = Field(default_factory=list)


class PodAffinityTerm(Base):
    label_selector: LabelSelector | None = None
    namespace_selector: LabelSelector | None = None
    namespaces: Annotated[list[Name], Field(max_length=64)] = Field(default_factory=list)
    topology_key: Key
    match_label_keys: Values = Field(default_factory=list)
    mismatch_label_keys: Values = Field(default_factory=list)


class WeightedPodAffinityTerm(Base):
    weight: Annotated[int, Field(ge=1, le=100)]
    pod_affinity_term: PodAffinityTerm


class PodAffinity(Base):
    required_during_scheduling_ignored_during_execution: Annotated[
        list[PodAffinityTerm], Field(max_length=32)] = Field(default_factory=list)
    preferred_during_scheduling_ignored_during_execution: Annotated[
        list[WeightedPodAffinityTerm], Field(max_length=32)] = Field(default_factory=list)


class Affinity(Base):
    """core/v1 Affinity, typed to the depth the scheduler reads."""

    node_affinity: NodeAffinity | None = None
    pod_affinity: PodAffinity | None = None
    pod_anti_affinity: PodAffinity | None = None
