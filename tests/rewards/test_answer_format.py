"""Answer matcher and format checker on tricky inputs."""

from __future__ import annotations

import re
import time
from fractions import Fraction

import pytest

from tandem.sidecars.rewards.answer import answer_match, boxed, extract_answer, parse_number
from tandem.sidecars.rewards.combine import RewardSet
from tandem.sidecars.rewards.format import PatternError, format_match
from tandem.spec.rewards import Reward


@pytest.mark.parametrize(
    ("completion", "answer"),
    [
        ("1,000", 1000),
        ("The answer is 1,000.", "1000"),
        ("Answer: 1 000", 1000),
        ("#### 12_345", "12345"),
        ("\\boxed{\\frac{1}{2}}", 0.5),
        ("so $\\boxed{\\dfrac{3}{4}}$.", "0.75"),
        ("\\boxed{-\\frac{1}{2}}", "-0.5"),
        ("\\boxed{\\frac{\\frac{1}{2}}{2}}", "1/4"),  # nested braces
        ("\\boxed{\\frac12}", "0.5"),
        ("3/4", "0.75"),
        ("-3/4", "-0.75"),
        ("Answer: 42.", 42),  # trailing period
        ("Answer: -7", "-7"),
        ("The answer is 0.30000000000000004", "0.3"),  # float tolerance
        ("Answer: 0.333333333", "0.3333333333"),  # float tolerance 1e-6 relative
        ("Answer: 1e3", 1000),
        ("Answer: 50%", "50"),
        ("Answer: $5", 5),
        ("<answer>42</answer>", "42"),
        (" <answer> 17 </answer>\n", 17),
        ("first <answer>1</answer> then <answer>2</answer>", 2),  # last one counts
        ("Answer: Paris!", "paris"),
        ("\\boxed{\\text{New  York}}", "new york"),
        ("The answer is: Blue Whale.", "blue-whale"),
        ("42", "\\boxed{42}"),
        ("\\boxed 7", 7),
    ],
)
def test_matches(completion: str, answer: object) -> None:
    assert answer_match(completion, answer) == 1.0


@pytest.mark.parametrize(
    ("completion", "answer"),
    [
        ("Answer: 1,001", 1000),
        ("Answer: 0.5001", "0.5"),
        ("\\boxed{\\frac{1}{3}}", 0.33),
        ("Answer: 42 apples and 3 pears", 42),  # not a number, not the same string
        ("Answer: -42", 42),
        ("<answer></answer>", ""),  # empty answers never match
        ("Answer: 3,4", 34),  # not a thousands separator
        ("Answer: 1/0", 0),
        ("\\boxed{\\frac{1}{", "1"),  # unbalanced
        ("Answer: London", "Paris"),
        ("17+25=42 but Answer: 41", 42),
    ],
)
def test_mismatches(completion: str, answer: object) -> None:
    assert answer_match(completion, answer) == 0.0


def test_helpers() -> None:
    assert boxed("a \\boxed{x^{2}+{1}} b \\boxed{y}") == "y"
    assert boxed("\\boxed{a{b}c}") == "a{b}c"
    assert extract_answer("reasoning... #### 12") == "12"
    assert parse_number("1,234,567.5") == Fraction(2469135, 2)
    assert parse_number("1,23") is None
    assert parse_number("abc") is None
    assert parse_number("\\left( 3 \\right)") == 3


PATTERN = r"<answer>-?\d+</answer>"


@pytest.mark.parametrize(
    ("completion", "score"),
    [
        ("<answer>42</answer>", 1.0),
        ("  <answer>-3</answer>\n", 1.0),  # surrounding whitespace is stripped
        ("<answer>42</answer> extra", 0.0),  # fullmatch, not search
        ("text <answer>42</answer>", 0.0),
        ("<answer>4 2</answer>", 0.0),
        ("<answer>42", 0.0),
    ],
)
def test_format_fullmatch(completion: str, score: float) -> None:
    assert format_match(completion, PATTERN) == score


def test_format_dotall_and_contains() -> None:
    assert format_match("line one\nline two", r"line.*two") == 1.0
    assert format_match("blah <answer>1</answer> blah", r".*<answer>\d+</answer>.*") == 1.0


def test_format_pattern_cannot_hang_on_a_completion() -> None:
    """User regex x policy completion: RE2 does not backtrack, so patterns exponential for a backtracking
    engine (Python's re, the regex module) answer at once, and correctly, on a long completion."""
    t0 = time.monotonic()
    assert format_match("a" * 100_000 + "!", r"(a+)+$") == 0.0
    assert format_match("a" * 100_000 + "!", r"(a|aa)+$") == 0.0
    assert format_match("a" * 100_000, r"(a|aa)+$") == 1.0
    assert time.monotonic() - t0 < 2.0


def test_format_matches_in_re2_not_python_re() -> None:
    """The reward's dialect is RE2, the API server's (Go's regexp): \\d is an ASCII digit (Python's re takes any
    Unicode digit), and what only Python's re knows (backreferences, lookahead) does not compile."""
    assert re.fullmatch(r"<answer>\d+</answer>", "<answer>\u0663</answer>")  # Arabic-Indic three, for Python
    assert format_match("<answer>\u0663</answer>", r"<answer>\d+</answer>") == 0.0
    assert format_match("<answer>3</answer>", r"<answer>\d+</answer>") == 1.0
    for pattern in (r"(a)\1", r"(?=a)a", "(<answer>"):
        with pytest.raises(PatternError, match=r"not a valid RE2 regular expression"):
            format_match("aa", pattern)


def test_invalid_pattern_names_the_field() -> None:
    with pytest.raises(PatternError, match=r"spec\.rewards\[1\]\.pattern: pattern '\(a': not a valid RE2 regular"):
        RewardSet([Reward(type="answerMatch"), Reward.model_construct(type="format", pattern="(a", weight=1.0)])
    assert RewardSet([Reward(type="format", pattern=r"<answer>\d+</answer>")]).names == ["format"]
