"""One verdict for every input: `tandem validate` (`tandem.spec.load.load_job` on the job file) and the
API server (a server-side dry run against the CRD the chart installs, schema and CEL rules) accept and
refuse the same specs, and refuse each with the same rule's message.

The cases (agreement_cases.py) are generated: one or more per Rule of the spec (every rule broken by
some case, checked here without a cluster), one per integer, number and boolean field of the CRD's
schema written as quoted text (and integers for numbers, integral floats for integers), and each
preset beside each setting a preset's fields meet in a rule. A `format` reward's pattern is judged by
both in one dialect, RE2 (tandem.spec.pattern): PATTERN_CASES. The few specs only Python can judge (the
job name's length and form) are accepted by the API server and refused by the operator at once, before
any pod (InvalidSpec: test_operator_invalid.py's OPERATOR_ONLY).
"""

from __future__ import annotations

import json
import ssl
import urllib.error
import urllib.request
import zlib
from pathlib import Path
from typing import Any

import pytest
import yaml
from agreement_cases import BESIDE_PRESET, RULE_CASES, Case, preset_cases, rule_registry, type_cases
from controlplane import ControlPlane
from test_operator_invalid import OPERATOR_ONLY
from wrappers import JobWrapper

from tandem.spec.load import SpecError, as_kubectl_sends, load_job
from tandem.spec.presets import PRESETS

# Rules no spec can break: the field's own schema bound already refuses what the rule would.
UNBREAKABLE = {("JobSpec", ".algorithm.groupSize"): "algorithm.groupSize has minimum 2 in the schema"}
# Refused by both, the API server by the list's map key (x-kubernetes-list-map-keys) before any rule.
SERVER_WORDS = {("PodSpecOverride", ".volumes"): "Duplicate value", ("PodSpecOverride", ".containers"):
                "Duplicate value"}
# A format reward's pattern: RE2 to both (the API server: CEL's matches on the field; tandem validate: the RE2
# library), so a pattern Python's re compiles and RE2 does not (a backreference, look-around) is refused by both.
PATTERN_CASES = {  # case: (pattern, accepted)
    "pattern-re2": (r"<answer>-?\d+</answer>", True),
    "pattern-named-groups": (r"(?P<a>x)(?<b>y)", True),  # both spellings: RE2 and Go's regexp take them
    "pattern-unclosed": ("(<answer>", False),
    "pattern-backreference": (r"(a)\1", False),  # Python's re compiles it
    "pattern-lookahead": ("(?=x)", False),  # Python's re compiles it
    "pattern-lookbehind-unclosed": ("(?<=a", False),
    "pattern-repeat-over-1000": ("a{1001}", False),  # Python's re compiles it; RE2's bound is 1000
    "pattern-any-byte": (r"a\Cb", False),  # the RE2 library compiles it, Go's regexp does not
    "pattern-any-byte-quoted": (r"\Qa\Cb\E", True),  # literal text
}
PATTERN_REFUSED = "not a valid RE2 regular expression"

Verdict = tuple[bool, str]  # accepted, the message of a refusal
# The least the agreement test runs (121 rules, 171 rule cases, 98 type cases when written): a generator that
# silently yields fewer (a schema walk that stops recursing, a rule no longer registered) fails here, not in a
# printed count nobody reads. Lower a floor only with the cases it no longer needs.
FLOORS = {"rules": 120, "rule cases": 170, "type cases": 95, "presets": 6}


def all_cases() -> list[Case]:
    return RULE_CASES + type_cases() + preset_cases()


def doc_of(case: str, changes: dict[str, Any]) -> dict[str, Any]:
    w = JobWrapper(f"agree-{zlib.crc32(case.encode()):08x}")
    for path, value in changes.items():
        w.set(path, value)
    return w.obj()


def offline(tmp: Path, case: str, doc: dict[str, Any]) -> Verdict:
    """What `tandem validate` says of the job file."""
    path = tmp / f"{case}.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    try:
        load_job(path)
    except SpecError as e:
        return False, str(e)
    return True, ""


def dry_run(cp: ControlPlane, doc: dict[str, Any]) -> Verdict:
    """The API server's verdict on the job as `kubectl create --dry-run=server -f job.yaml` sends it (strict
    field validation; an integral float such as 8.0 written as 8, as kubectl's YAML-to-JSON does), over HTTPS."""
    ctx = ssl.create_default_context(cafile=str(cp.pki / "ca.crt"))
    ctx.load_cert_chain(str(cp.pki / "admin.crt"), str(cp.pki / "admin.key"))
    url = f"{cp.server}/apis/tandem.dev/v1alpha1/namespaces/default/rlhfjobs?dryRun=All&fieldValidation=Strict"
    req = urllib.request.Request(url, data=json.dumps(as_kubectl_sends(doc)).encode(), method="POST",
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, context=ctx, timeout=30):  # noqa: S310
            return True, ""
    except urllib.error.HTTPError as e:
        if e.code >= 500:
            raise
        return False, str(json.loads(e.read()).get("message", ""))


def test_every_rule_is_broken_by_a_case(tmp_path: Path) -> None:
    """Each Rule (CEL + Python) has a case that `tandem validate` refuses with that rule's message."""
    messages = [offline(tmp_path, case, doc_of(case, changes))[1] for case, changes in RULE_CASES]
    missing = [(title, field, msg) for title, field, msg in rule_registry() if (title, field) not in UNBREAKABLE
               and not any(f"{field.lstrip('.')}: {msg}" in m for m in messages)]
    assert not missing, "rules no case breaks:\n" + "\n".join(map(str, missing))
    assert len({c for c, _ in all_cases()}) == len(all_cases()), "case ids repeat"


def test_the_case_counts_hold_their_floors() -> None:
    """The counts test_offline_and_api_server_agree prints: each generator at least its floor, every preset beside
    every setting."""
    counts = {"rules": len(rule_registry()), "rule cases": len(RULE_CASES), "type cases": len(type_cases()),
              "presets": len(PRESETS)}
    assert {k: v for k, v in counts.items() if v < FLOORS[k]} == {}, (counts, FLOORS)
    assert len(preset_cases()) == len(PRESETS) * len(BESIDE_PRESET)


def test_python_only_cases_are_the_operators() -> None:
    """The specs only Python judges are refused by the operator at admission (InvalidSpec, no pods); a
    format pattern is no longer one of them."""
    operator_only = {case for case, _, _ in OPERATOR_ONLY}
    assert "name-too-long" in operator_only and not any("pattern" in case for case in operator_only)


@pytest.mark.parametrize("case", sorted(PATTERN_CASES))
def test_validate_judges_a_pattern_in_re2(tmp_path: Path, case: str) -> None:
    """`tandem validate`: a pattern RE2 compiles passes; any other is refused naming the field."""
    pattern, expected = PATTERN_CASES[case]
    accepted, message = offline(tmp_path, case, doc_of(case, {"rewards": [{"type": "format", "pattern": pattern}]}))
    assert accepted == expected, message
    if not expected:
        assert f"spec.rewards.0.pattern: {PATTERN_REFUSED}" in message, message


@pytest.mark.k8s
def test_offline_and_api_server_agree(installed: ControlPlane, tmp_path: Path) -> None:
    cases = all_cases()
    disagree: list[str] = []
    wrong_words: list[str] = []
    verdicts: dict[str, tuple[Verdict, Verdict]] = {}
    for case, changes in cases:
        doc = doc_of(case, changes)
        mine, server = offline(tmp_path, case, doc), dry_run(installed, doc)
        verdicts[case] = (mine, server)
        if mine[0] != server[0]:
            disagree.append(f"{case}: tandem validate {'accepts' if mine[0] else 'refuses'}, the API server "
                            f"{'accepts' if server[0] else 'refuses'}\n    offline: {mine[1]}\n    server: {server[1]}")
    for title, field, msg in rule_registry():  # a rule's refusal carries its words in both
        if (title, field) in UNBREAKABLE:
            continue
        words = f"{field.lstrip('.')}: {msg}"
        hits = [c for c, (mine, _) in verdicts.items() if words in mine[1]]
        server_words = SERVER_WORDS.get((title, field), words)
        if hits and not any(server_words in verdicts[c][1][1] for c in hits):
            wrong_words.append(f"{title}{field}: {words!r} not in the API server's refusal of {hits}")
    assert len(verdicts) == len(cases), "a case id repeats: its verdict replaced another's"
    refused = sum(1 for mine, _ in verdicts.values() if not mine[0])
    print(f"agreement: {len(rule_registry())} rules, {len(cases)} cases ({len(RULE_CASES)} rule, "
          f"{len(type_cases())} type, {len(preset_cases())} preset), {refused} refused, "
          f"{len(cases) - refused} accepted")
    assert not disagree, f"{len(disagree)} of {len(cases)} cases disagree:\n" + "\n".join(disagree)
    assert not wrong_words, "\n".join(wrong_words)
    assert 0 < refused < len(cases)


@pytest.mark.k8s
@pytest.mark.parametrize("case", sorted(PATTERN_CASES))
def test_a_pattern_gets_one_verdict(installed: ControlPlane, tmp_path: Path, case: str) -> None:
    """The API server (the CRD's CEL, Go's RE2) and `tandem validate` (the RE2 library) accept and refuse the same
    patterns, each refusal naming spec.rewards[i].pattern and saying RE2."""
    pattern, expected = PATTERN_CASES[case]
    doc = doc_of(case, {"rewards": [{"type": "answerMatch"}, {"type": "format", "pattern": pattern}]})
    mine, server = offline(tmp_path, case, doc), dry_run(installed, doc)
    assert mine[0] == server[0] == expected, f"offline: {mine}\nserver: {server}"
    if not expected:
        assert f"spec.rewards.1.pattern: {PATTERN_REFUSED}" in mine[1], mine[1]
        assert "spec.rewards[1].pattern" in server[1] and PATTERN_REFUSED in server[1], server[1]
