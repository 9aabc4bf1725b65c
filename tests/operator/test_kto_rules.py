"""KTO's rules on a job (`algorithm.name: kto`, `dataset.completionField`, `dataset.labelField`), enforced
twice from one declaration: offline by `tandem.spec.load.parse_job` (what `tandem validate` prints) and
by the real API server from the CRD's CEL rules, each naming the field. Also the combinations that must
pass both: a kto job with its two fields, and kto beside an evaluation dataset without them.
"""

from __future__ import annotations

from rule_checks import Accepted, Rejected, rule_tests
from wrappers import JobWrapper

W = JobWrapper


def kto() -> JobWrapper:
    return W().set("algorithm.name", "kto").set("dataset.completionField", "completion") \
        .set("dataset.labelField", "label")


REJECTED: Rejected = [
    ("kto-without-completion-field", lambda: kto().unset("dataset.completionField"), "spec.dataset.completionField",
     "kto trains on labelled completions"),
    ("kto-without-label-field", lambda: kto().unset("dataset.labelField"), "spec.dataset.labelField",
     "kto trains on labelled completions"),
    ("completion-field-for-grpo", lambda: W().set("dataset.completionField", "c"), "spec.dataset.completionField",
     "applies to kto only"),
    ("label-field-for-dpo", lambda: W().set("algorithm.name", "dpo").set("dataset.labelField", "l"),
     "spec.dataset.labelField", "applies to kto only"),
    ("label-field-on-eval", lambda: kto().set("eval", {"dataset": {"path": "/data/t.jsonl", "labelField": "l"}}),
     "spec.eval.dataset", "do not apply"),
    ("kto-partial", lambda: kto().set("rollout.maxTokens", 64).set("rollout.partial", {"tokenBudget": 8}),
     "spec.rollout.partial", "kto generates no training completions"),
    ("kto-max-staleness", lambda: kto().set("algorithm.maxStaleness", 1), "spec.algorithm.maxStaleness",
     "does not apply to kto"),  # the field the job wrote, not algorithm.name
    ("kto-clip", lambda: kto().set("algorithm.clipC", 3.0), "spec.algorithm.clipC", "does not apply to kto"),
    ("kto-empty-label-field", lambda: kto().set("dataset.labelField", ""), "spec.dataset.labelField", ""),
    ("weights-for-dpo", lambda: W().set("algorithm.name", "dpo").set("algorithm.desirableWeight", 1.33),
     "spec.algorithm.desirableWeight", "applies to kto"),
]
ACCEPTED: Accepted = [
    ("kto", kto),
    ("kto-weights-and-eval", lambda: kto().set("algorithm.desirableWeight", 1.33).set("algorithm.beta", 0.2)
     .set("eval", {"dataset": {"path": "/data/t.jsonl"}})),
]

(test_offline_validation_names_the_field, test_offline_validation_accepts, test_api_server_rejects_naming_the_field,
 test_api_server_accepts) = rule_tests(REJECTED, ACCEPTED)
