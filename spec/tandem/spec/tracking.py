"""`spec.tracking`: where the trainer's metrics rows go besides metrics.jsonl (TensorBoard, MLflow, W&B).

Role: the shape of the three sinks of `tandem.sidecars.trainer.observe.tracking` and the rules that keep a
credential out of the job: a tracking URI or W&B base URL may not carry `user:password@`, and the credentials
come from a Secret named here, which `tandem.operator.manifests.tracking_access` hands to the trainer container by
secretKeyRef. Callers: `tandem.spec.models` (`JobSpec.tracking`, re-exported there), the trainer's tracker,
the operator's builders. Named, like every spec module, for the part of the spec it mirrors; the sinks
themselves are `tandem.sidecars.trainer.observe.tracking`.
"""

from __future__ import annotations

import re
from typing import Annotated, Literal

from pydantic import Field

from tandem.spec.strict_model import DNS_SUBDOMAIN, Base, Rule

_USERINFO = "^[a-z]+://[^/?#]*@"  # user:password@ in a URL: CEL's and Python's regex alike
WANDB_NAME = r"^[A-Za-z0-9_.\-]+$"  # a W&B project or entity: none of / \ # ? % : or spaces


class MLflow(Base):
    tracking_uri: Annotated[str, Field(pattern=r"^(https?://[^\s/]+(/\S*)?|file:///\S*)$", max_length=2048,
                                       description="MLflow tracking server (http(s)://host[:port]) or a file "
                                       "store (file:///absolute/path); no user:password@ (credentialsSecret).")]
    experiment: Annotated[str, Field(min_length=1, max_length=256)] = "tandem"
    run_name: Annotated[str | None, Field(min_length=1, max_length=256,
                                          description="Default: the job's name.")] = None
    credentials_secret: Annotated[str | None, Field(pattern=DNS_SUBDOMAIN, max_length=253, description="Secret in "
                                  "the job's namespace with the server's credentials, each key optional: username "
                                  "and password (basic auth) or token (bearer); the trainer gets them as "
                                  "MLFLOW_TRACKING_USERNAME, _PASSWORD and _TOKEN (secretKeyRef).")] = None
    rules = (  # on the object, so that neither the API server's message nor ours ever shows the URI
        Rule(f"!self.trackingUri.matches('{_USERINFO}')", "must not carry credentials (user:password@host): "
             "it is stored in the job and logged; name a Secret in tracking.mlflow.credentialsSecret instead",
             ".trackingUri", lambda m: re.match(_USERINFO, m.tracking_uri) is None),
    )


class WandB(Base):
    """Weights & Biases: one W&B run per job (its id from the job's uid, so a restart or `--resume` continues it)."""

    project: Annotated[str | None, Field(pattern=WANDB_NAME, max_length=128,
                                         description="W&B project. Default: the job's namespace.")] = None
    entity: Annotated[str | None, Field(pattern=WANDB_NAME, max_length=128, description="W&B team or user. "
                                        "Default: the API key's default entity (or WANDB_ENTITY).")] = None
    run_name: Annotated[str | None, Field(min_length=1, max_length=128,
                                          description="Display name of the run. Default: the job's name.")] = None
    group: Annotated[str | None, Field(min_length=1, max_length=128, description="Run group. Default: the job's "
                                       "name (a job deleted and created again is a new run of the same group).")] = None
    tags: Annotated[list[Annotated[str, Field(min_length=1, max_length=64)]], Field(max_length=20)] = Field(
        default_factory=list, description="Tags of the run, beside `tandem` and the algorithm's name.")
    base_url: Annotated[str | None, Field(pattern=r"^https?://[^\s/]+(/\S*)?$", max_length=2048, description="A "
                                          "self-hosted W&B server (WANDB_BASE_URL); no user:password@.")] = None
    mode: Literal["online", "offline"] = Field(default="online", description="offline: files only (under the "
                                               "run directory, or WANDB_DIR), for `wandb sync` later; the "
                                               "trainer's WANDB_MODE, when set, wins.")
    credentials_secret: Annotated[str | None, Field(pattern=DNS_SUBDOMAIN, max_length=253, description="Secret in "
                                  "the job's namespace whose key apiKey the trainer gets as WANDB_API_KEY "
                                  "(secretKeyRef); the API key is never in the job.")] = None
    rules = (
        Rule(f"!has(self.baseUrl) || !self.baseUrl.matches('{_USERINFO}')", "must not carry credentials "
             "(user:password@host): name a Secret in tracking.wandb.credentialsSecret instead", ".baseUrl",
             lambda w: w.base_url is None or re.match(_USERINFO, w.base_url) is None),
    )


class Tracking(Base):
    """Experiment tracking of the trainer's metrics rows (tandem.sidecars.trainer.observe.tracking)."""

    tensorboard: bool = Field(default=True, description="TensorBoard event files in the run's output directory "
                              "(<dir>/tensorboard/), where the trainer has one.")
    mlflow: MLflow | None = Field(default=None, description="Also log to MLflow; an unreachable server only "
                                  "logs a warning.")
    wandb: WandB | None = Field(default=None, description="Also log to Weights & Biases; an unreachable server "
                                "only logs a warning.")
