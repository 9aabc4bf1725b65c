"""Flexible answer matching (last number, whole-word phrase) beside strict, and the spec's `match` field."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml
from pydantic import ValidationError

from tandem.sidecars.rewards import RewardInput, RewardSet
from tandem.sidecars.rewards.answer import answer_match, contains_phrase, last_number
from tandem.spec.load import SpecError, parse_job
from tandem.spec.rewards import Reward

EXAMPLE_JOB = Path(__file__).resolve().parents[2] / "examples" / "tiny-grpo.yaml"


@pytest.mark.parametrize(
    ("completion", "answer"),
    [
        ("The capital of Kenya is Nairobi.", "Nairobi"),
        ("4 + 1 = 5", "5"),
        ("4 + 1 = 5", 5),
        ("First 12 apples, then 1,234 more, so 1,246 in all.", "1246"),
        ("... so 0.75", "3/4"),
        ("three quarters, i.e. 3/4 of it", 0.75),
        ("so x = \\frac{1}{2} exactly", "0.5"),
        ("The temperature fell to -12 degrees.", "-12"),
        ("It costs $2,500.50 in total", "2500.5"),
        ("Nearly 1e3 people came", 1000),
        ("Reasoning... #### 72", "Natalia sold 48/2 = 24 clips in May... #### 72"),  # GSM8K reference
        ("the city of new york, clearly", "New-York"),  # punctuation and case ignored
        ("I pick (B) because", "B"),
        ("I was unsure about 7. Answer: 5", "5"),  # a marker's answer wins over later text
    ],
)
def test_flexible_matches_where_strict_does_not(completion: str, answer: object) -> None:
    assert answer_match(completion, answer, "flexible") == 1.0
    if "Answer:" not in completion and "####" not in completion:
        assert answer_match(completion, answer, "strict") == 0.0
        assert answer_match(completion, answer) == 0.0  # strict is the default


@pytest.mark.parametrize(
    ("completion", "answer"),
    [
        ("4 + 1 = 5", "4"),  # the LAST number counts
        ("5 apples, or was it 6?", 5),
        ("Nairobiville is a town.", "Nairobi"),  # whole words only
        ("The capital is Nai robi", "Nairobi"),
        ("", "Nairobi"),
        ("", "5"),
        ("   ", "0"),
        ("no numbers here", "3"),
        ("About 1,001 of them", 1000),
        ("5-3", "-3"),  # a minus between numbers is not a sign
        ("I was unsure about 5. Answer: 7", "5"),  # the marker's answer, not the prose
        ("Nairobi? No. Answer: Mombasa", "Nairobi"),
        ("This is a hard one", "A"),  # the article is not option A
        ("See version 1.2.3", "1.2"),
        ("Capital: Nairobi", ""),  # an empty reference never matches
    ],
)
def test_flexible_mismatches(completion: str, answer: object) -> None:
    assert answer_match(completion, answer, "flexible") == 0.0


def test_strict_keeps_its_behaviour_with_markers() -> None:
    for mode in ("strict", "flexible"):
        assert answer_match("<answer>42</answer>", 42, mode) == 1.0  # type: ignore[arg-type]
        assert answer_match("\\boxed{\\frac{3}{4}}", "0.75", mode) == 1.0  # type: ignore[arg-type]
        assert answer_match("Answer: 41", 42, mode) == 0.0  # type: ignore[arg-type]
    # flexible also reads inside the marker's answer; strict compares it whole
    assert answer_match("Answer: it is 42 apples", 42, "flexible") == 1.0
    assert answer_match("Answer: it is 42 apples", 42, "strict") == 0.0
    with pytest.raises(ValueError, match="match"):
        answer_match("5", 5, "fuzzy")  # type: ignore[arg-type]


def test_helpers() -> None:
    assert last_number("a -3 and then 1,000,000.5 units") == pytest.approx(1_000_000.5)
    assert last_number("x = \u22124") == -4  # unicode minus
    assert last_number("x\u22124") == 4  # a minus after a word is not a sign
    assert last_number("v2 and x3") is None  # parts of words
    assert contains_phrase("Born in New York City.", "new york")
    assert not contains_phrase("Born in New Yorkshire.", "new york")
    assert contains_phrase("A is right", "A") and not contains_phrase("a is right", "A")


def _reward(**fields: Any) -> Reward:
    return Reward.model_validate(fields)


def test_spec_match_field_and_rule() -> None:
    assert _reward(type="answerMatch").match == "strict"
    assert _reward(type="answerMatch", match="flexible").match == "flexible"
    assert _reward(type="codeExec", match="strict").match == "strict"
    assert _reward(type="answerMatch", match="flexible").model_dump(by_alias=True)["match"] == "flexible"
    with pytest.raises(ValidationError, match="match"):
        _reward(type="answerMatch", match="fuzzy")
    for other in ({"type": "codeExec"}, {"type": "format", "pattern": "x"}, {"type": "model", "path": "/m"}):
        with pytest.raises(ValidationError, match="match applies only to answerMatch"):
            _reward(**other, match="flexible")


def test_job_error_names_the_match_field() -> None:
    doc = yaml.safe_load(EXAMPLE_JOB.read_text())
    doc["spec"]["rewards"] = [{"type": "answerMatch"}, {"type": "codeExec", "match": "flexible"}]
    with pytest.raises(SpecError) as err:
        parse_job(doc, "job")
    assert "spec.rewards.1.match" in err.value.fields, str(err.value)
    doc["spec"]["rewards"] = [{"type": "answerMatch", "match": "flexible"}]
    assert parse_job(doc, "job").spec.rewards[0].match == "flexible"


def test_reward_set_uses_each_rewards_mode() -> None:
    rs = RewardSet([_reward(type="answerMatch"), _reward(type="answerMatch", match="flexible")])
    items = [RewardInput("Capital of Kenya?", "The capital of Kenya is Nairobi.", "Nairobi"),
             RewardInput("2+3?", "2 + 3 = 5", "5"),
             RewardInput("2+3?", "2 + 3 = 6", "5"),
             RewardInput("2+3?", "<answer>5</answer>", "5")]
    totals, comps = rs.score(items)
    assert comps == {"answerMatch#0": [0.0, 0.0, 0.0, 1.0], "answerMatch#1": [1.0, 1.0, 0.0, 1.0]}
    assert totals == [1.0, 1.0, 0.0, 2.0]


def test_numbers_beyond_float_range_compare_without_crashing() -> None:
    """A sampled answer of 400 digits has no float (it crashed the driver's reward step once)."""
    huge = "1" + "0" * 400
    assert answer_match(f"<answer>{huge}</answer>", "7") == 0.0
    assert answer_match(f"<answer>{huge}</answer>", huge) == 1.0
    assert answer_match("Answer: " + "9" * 500, "3", "flexible") == 0.0


def test_huge_exponents_compare_as_floats_at_once() -> None:
    """A sampled `1e999999999` is a billion-digit integer exactly: building it hung the driver's reward
    step for over an hour. Beyond MAX_EXACT_EXPONENT it is a float (inf, 0.0); within, still exact."""
    from fractions import Fraction

    from tandem.sidecars.rewards.answer import MAX_EXACT_EXPONENT, parse_number

    assert parse_number("1e999999999") == float("inf")
    assert parse_number("-2E+999999999") == float("-inf")
    assert parse_number("5e-999999999") == 0.0
    assert parse_number(f"3e{MAX_EXACT_EXPONENT}") == Fraction(3 * 10**MAX_EXACT_EXPONENT)
    assert answer_match("<answer>1e999999999</answer>", "7") == 0.0
    assert answer_match("The answer is 7e999999999", "7", "flexible") == 0.0
    assert answer_match("<answer>1.5e2</answer>", "150") == 1.0
