"""The RLHFJob spec: typed, defaulted, validated models shared by the operator, the CLI and the sidecars.

Callers: `tandem.operator` (reconcile), `tandem.cli` (`tandem validate`, `tandem run`), the sidecars
(hyper-parameters). The CRD's openAPIV3Schema is generated from these models by `tandem.spec.crd`.
Each module is named for the part of the spec it mirrors (`tracking`, `rollout_correction`, `rollout`,
`environment`, ...); a sidecar module of the same name is the behaviour that field configures. `strict_model`
holds the base class every model derives from (camelCase wire names, unknown fields refused, cross-field rules).
"""

from tandem.spec import crd, load, models
from tandem.spec.load import SpecError, load_job, parse_job
from tandem.spec.models import API_VERSION, GROUP, KIND, PLURAL, VERSION, JobSpec, RLHFJob

__all__ = [
    "API_VERSION", "GROUP", "KIND", "PLURAL", "VERSION", "JobSpec", "RLHFJob", "SpecError",
    "crd", "load", "load_job", "models", "parse_job",
]
