"""How the trainer reaches a tracking server that wants credentials: `spec.tracking.mlflow.credentialsSecret`.

Callers: `tandem.operator.builders` (the trainer container's env). Pure.

The Secret's keys become MLflow's own variables, each by secretKeyRef, so no credential is ever in
the pod spec, the job's ConfigMap (job.yaml) or the RLHFJob itself; `spec.tracking.mlflow.trackingUri`
may not carry `user:password@` (a rule of `tandem.spec.models.MLflow`):

  username  MLFLOW_TRACKING_USERNAME   HTTP basic auth, with
  password  MLFLOW_TRACKING_PASSWORD
  token     MLFLOW_TRACKING_TOKEN      bearer token (instead of the two above)

Each key is optional (`optional: true`): a Secret holds the ones its server needs, and a missing
Secret or key starts the trainer without that variable (MLflow's 401 is then a warning in the trainer's
log and training goes on, as for an unreachable server). Only the trainer container gets them: the
driver rank is the one that logs to MLflow; the rollout and sandbox containers never see them.
`tandem run` starts local processes with the invoking shell's environment, so its trainers take
MLFLOW_TRACKING_* from there (`tandem.cli.procs`: a secretKeyRef of a Secret other than the job's
own leaves the shell's value).
"""

from __future__ import annotations

from typing import Any

from tandem.spec.models import RLHFJob

Manifest = dict[str, Any]

# Secret key → the variable MLflow's client reads (mlflow.environment_variables).
CREDENTIAL_KEYS = {
    "username": "MLFLOW_TRACKING_USERNAME",
    "password": "MLFLOW_TRACKING_PASSWORD",
    "token": "MLFLOW_TRACKING_TOKEN",
}


def trainer_env(job: RLHFJob) -> list[Manifest]:
    """Env entries of the trainer container for the job's MLflow credentials (none without a Secret)."""
    mlflow = job.spec.tracking.mlflow
    if mlflow is None or mlflow.credentials_secret is None:
        return []
    return [{"name": var, "valueFrom": {"secretKeyRef": {"name": mlflow.credentials_secret, "key": key,
                                                         "optional": True}}}
            for key, var in CREDENTIAL_KEYS.items()]
