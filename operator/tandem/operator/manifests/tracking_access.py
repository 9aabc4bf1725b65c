"""How the trainer reaches a tracking server that wants credentials: `spec.tracking.mlflow.credentialsSecret` and
`spec.tracking.wandb.credentialsSecret`.

Callers: `tandem.operator.manifests.builders` (the trainer container's env). Pure.

The Secret's keys become MLflow's own variables, each by secretKeyRef, so no credential is ever in
the pod spec, the job's ConfigMap (job.yaml) or the RLHFJob itself; `spec.tracking.mlflow.trackingUri`
may not carry `user:password@` (a rule of `tandem.spec.models.MLflow`):

  username  MLFLOW_TRACKING_USERNAME   HTTP basic auth, with
  password  MLFLOW_TRACKING_PASSWORD
  token     MLFLOW_TRACKING_TOKEN      bearer token (instead of the two above)

Weights & Biases: the Secret's key `apiKey` becomes WANDB_API_KEY, the variable wandb's client reads
(`spec.tracking.wandb.baseUrl`, a self-hosted server, is in the spec: it is no secret).

Each key is optional (`optional: true`): a Secret holds the ones its server needs, and a missing
Secret or key starts the trainer without that variable (MLflow's 401 is then a warning in the trainer's
log and training goes on, as for an unreachable server). Only the trainer container gets them: the
driver rank is the one that logs to MLflow; the rollout and sandbox containers never see them.
`tandem run` starts local processes with the invoking shell's environment, so its trainers take
MLFLOW_TRACKING_* and WANDB_API_KEY from there (`tandem.cli.local_procs`: a secretKeyRef of a Secret other than
the job's own leaves the shell's value).
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

WANDB_KEYS = {"apiKey": "WANDB_API_KEY"}  # Secret key → the variable wandb reads (wandb.env.API_KEY)


def _by_ref(secret: str, keys: dict[str, str]) -> list[Manifest]:
    return [{"name": var, "valueFrom": {"secretKeyRef": {"name": secret, "key": key, "optional": True}}}
            for key, var in keys.items()]


def trainer_env(job: RLHFJob) -> list[Manifest]:
    """Env entries of the trainer container for the job's MLflow and W&B credentials (none without a Secret)."""
    mlflow, wandb = job.spec.tracking.mlflow, job.spec.tracking.wandb
    env: list[Manifest] = []
    if mlflow is not None and mlflow.credentials_secret is not None:
        env += _by_ref(mlflow.credentials_secret, CREDENTIAL_KEYS)
    if wandb is not None and wandb.credentials_secret is not None:
        env += _by_ref(wandb.credentials_secret, WANDB_KEYS)
    return env
