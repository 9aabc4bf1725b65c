"""Answer matcher: does a completion's final answer equal the reference answer? (1.0 or 0.0)

Role: the `answerMatch` rule-based reward, in the spec's `match` mode ("strict" or "flexible").
Callers: `rewards.combine` (one call per sample), the toy task (`toy.model`, strict).

Extraction (the last occurrence of the first kind found wins):
1. `<answer>X</answer>`;  2. `\\boxed{X}` / `\\fbox{X}` (nested braces balanced);
3. a line marker: `Answer: X`, `answer is X`, `#### X` (to the end of that line);
4. otherwise the whole completion.
Comparison: both sides are normalised (surrounding `$`/`\\(...\\)`, `\\text{}`, `\\left`/`\\right`,
trailing punctuation). If both parse as numbers they are compared numerically: integers,
decimals, signs, thousands separators (`1,000`, `1 000`, `1_000`), scientific notation, percent
signs dropped (`50%` == `50`), fractions `3/4`, `\\frac{3}{4}`, `\\dfrac34`; equal when exactly
equal as rationals or `isclose(rel_tol=1e-6, abs_tol=1e-9)`. Otherwise the strings are compared
after case folding, dropping punctuation and collapsing whitespace.

Strict mode scores 1.0 only when the extracted answer equals the reference. Flexible mode (for
completions in prose, like verl's GSM8K `flexible` method or lm-eval's flexible-extract) looks in
the extracted answer when a form 1-3 exists, else in the whole completion, and also accepts:
- a numeric reference: the LAST number there (signs, decimals, `1,000`, `3/4`, `\\frac{3}{4}`,
  `1e3`; `4 + 1 = 5` gives 5), compared numerically as above;
- a text reference: the normalised reference as a whole word or phrase anywhere there
  (`Nairobi` is found in `The capital of Kenya is Nairobi.` but not in `Nairobiville`); a
  one-letter reference (a multiple-choice option) must appear as that letter alone, case kept,
  so that the article "a" is not option A.
A phrase found anywhere also matches when the completion names it only to reject it: flexible
trades that false positive for prose answers; use markers and strict mode where it matters.
"""

from __future__ import annotations

import math
import re
from fractions import Fraction
from typing import Literal

_TAG = re.compile(r"<answer>(.*?)</answer>", re.DOTALL | re.IGNORECASE)
_MARKERS = re.compile(r"(?:answer\s*(?:is)?\s*[:=]|answer is|####)\s*(.+)", re.IGNORECASE)
_THOUSANDS = re.compile(r"^[+-]?\d{1,3}(?:([,\s_])\d{3})(?:\1\d{3})*(?:\.\d+)?$")
_NUMBER = re.compile(r"^[+-]?(?:\d+\.?\d*|\.\d+)(e[+-]?\d+)?$", re.IGNORECASE)
MAX_EXACT_EXPONENT = 400  # beyond a float's range; larger exponents compare as floats (inf, 0)
_UNSIGNED = r"(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?(?:[eE][+-]?\d+)?"
# a number in prose: optional sign, thousands commas, decimals, exponent, `a/b`, or a LaTeX fraction;
# not a piece of a word or of a longer dotted number (`x2`, `v1.2.3`)
_NUMBER_IN_TEXT = re.compile(
    r"[-+]?\\[dt]?frac(?:\{[^{}]*\}|\d){2}"
    rf"|(?<![\w.])(?:[-+](?=\d))?{_UNSIGNED}(?:\s*/\s*{_UNSIGNED})?(?![\w]|\.\d)"
)
MatchMode = Literal["strict", "flexible"]


def _braced(text: str, open_at: int) -> tuple[str, int] | None:
    """Content of the brace group opening at `open_at` and the index after its closing brace."""
    depth = 0
    for i in range(open_at, len(text)):
        if text[i] == "{":
            depth += 1
        elif text[i] == "}":
            depth -= 1
            if depth == 0:
                return text[open_at + 1:i], i + 1
    return None


def boxed(text: str) -> str | None:
    """Content of the last `\\boxed{...}` (or `\\fbox{...}`, `\\boxed X`) in `text`, braces balanced."""
    starts = [m.end() for m in re.finditer(r"\\(?:boxed|fbox)", text)]
    for start in reversed(starts):
        i = start
        while i < len(text) and text[i] == " ":
            i += 1
        if i < len(text) and text[i] == "{":
            group = _braced(text, i)
            if group is not None:
                return group[0]
        elif i > start:
            token = re.match(r"[^\s$]+", text[i:])
            if token:
                return token.group(0)
    return None


def extract_answer(completion: str) -> str:
    """The final answer in a completion (see the module docstring for the order of forms)."""
    tags = _TAG.findall(completion)
    if tags:
        return str(tags[-1]).strip()
    box = boxed(completion)
    if box is not None:
        return box.strip()
    markers = _MARKERS.findall(completion)
    if markers:
        return str(markers[-1]).strip()
    return completion.strip()


def _strip_latex(s: str) -> str:
    s = s.strip()
    for _ in range(3):
        if len(s) >= 2 and s[0] == "$" and s[-1] == "$":
            s = s.strip("$").strip()
        if s.startswith("\\(") and s.endswith("\\)") or s.startswith("\\[") and s.endswith("\\]"):
            s = s[2:-2].strip()
    s = re.sub(r"\\(?:text|textbf|mathrm|mbox)\{([^{}]*)\}", r"\1", s)
    s = re.sub(r"\\(?:left|right)\b", "", s)
    s = re.sub(r"\\[,;:! ]", "", s)
    s = s.replace("\\$", "").replace("\\%", "%")
    return s.strip().rstrip(".;,:!").strip()


def _frac(s: str) -> tuple[str, str] | None:
    m = re.match(r"^\\[dt]?frac", s)
    if not m:
        return None
    rest = s[m.end():].strip()
    parts: list[str] = []
    while rest and len(parts) < 2:
        if rest[0] == "{":
            group = _braced(rest, 0)
            if group is None:
                return None
            parts.append(group[0])
            rest = rest[group[1]:].strip()
        else:
            parts.append(rest[0])
            rest = rest[1:].strip()
    return (parts[0], parts[1]) if len(parts) == 2 and not rest else None


def parse_number(text: str) -> Fraction | float | None:
    """The number `text` denotes (exact Fraction when possible), or None if it is not a number."""
    s = _strip_latex(text).replace(" ", " ")
    s = s.removesuffix("%").strip()
    if s.startswith("$"):
        s = s[1:].strip()
    sign = 1
    if s[:1] in "+-" and s[1:2] and (s[1] == "\\" or s[1] == "("):
        sign, s = (-1 if s[0] == "-" else 1), s[1:].strip()
    if s.startswith("(") and s.endswith(")"):
        s = s[1:-1].strip()
    frac = _frac(s)
    if frac is not None:
        num, den = parse_number(frac[0]), parse_number(frac[1])
        if num is None or den is None or den == 0:
            return None
        value = Fraction(num) / Fraction(den) if not isinstance(num, float) and not isinstance(den, float) \
            else float(num) / float(den)
        return sign * value
    if "/" in s:
        a, _, b = s.partition("/")
        num, den = parse_number(a), parse_number(b)
        if num is None or den is None or den == 0:
            return None
        if isinstance(num, float) or isinstance(den, float):
            return sign * float(num) / float(den)
        return sign * Fraction(num) / Fraction(den)
    if _THOUSANDS.match(s):
        s = re.sub(r"[,\s_]", "", s)
    s = s.replace(" ", "")
    m = _NUMBER.match(s)
    if not m:
        return None
    if m.group(1) is not None and abs(int(m.group(1)[1:])) > MAX_EXACT_EXPONENT:
        # exactly, a sampled "1e999999999" is a billion-digit integer (minutes of CPU); as a float it is inf
        return sign * float(s)
    try:
        value = Fraction(s)
    except (ValueError, ZeroDivisionError):
        try:
            return sign * float(s)
        except ValueError:
            return None
    return sign * value


def normalise_text(text: str) -> str:
    """Case-folded, punctuation-free, whitespace-collapsed form of `text` (after LaTeX stripping)."""
    s = _strip_latex(text).casefold()
    s = re.sub(r"[^\w\s]", " ", s)
    return " ".join(s.split())


def numbers_equal(a: Fraction | float, b: Fraction | float) -> bool:
    if isinstance(a, Fraction) and isinstance(b, Fraction):
        if a == b:
            return True
    try:
        return math.isclose(float(a), float(b), rel_tol=1e-6, abs_tol=1e-9)
    except OverflowError:  # a sampled "answer" such as 10**400 has no float: unequal unless exactly equal
        return a == b


def answers_equal(candidate: str, reference: str) -> bool:
    """Numeric equality when both are numbers, else normalised-string equality."""
    a, b = parse_number(candidate), parse_number(reference)
    if a is not None and b is not None:
        return numbers_equal(a, b)
    if a is not None or b is not None:
        return False
    return normalise_text(candidate) == normalise_text(reference) != ""


def has_marker(completion: str) -> bool:
    """Whether the completion states its answer in one of the forms 1-3 (tag, boxed, line marker)."""
    return bool(_TAG.search(completion)) or boxed(completion) is not None or bool(_MARKERS.search(completion))


def last_number(text: str) -> Fraction | float | None:
    """The value of the last number written in `text` (see the module docstring), or None."""
    for m in reversed(list(_NUMBER_IN_TEXT.finditer(text.replace("\u2212", "-")))):
        value = parse_number(m.group(0))
        if value is not None:
            return value
    return None


def contains_phrase(text: str, phrase: str) -> bool:
    """`phrase` occurs in `text` as whole words, both normalised; a one-letter phrase: as that letter alone."""
    core = _strip_latex(phrase)
    if len(core) == 1 and core.isalpha():
        return re.search(rf"(?<![^\W_]){re.escape(core)}(?![^\W_])", text) is not None
    wanted = normalise_text(phrase)
    return wanted != "" and f" {wanted} " in f" {normalise_text(text)} "


def flexible_equal(region: str, reference: str) -> bool:
    """Strict equality, else the last number (numeric reference) or the phrase (text reference) in `region`."""
    if answers_equal(region, reference):
        return True
    expected = parse_number(reference)
    if expected is not None:
        found = last_number(region)
        return found is not None and numbers_equal(found, expected)
    return contains_phrase(region, reference)


def answer_match(completion: str, answer: object, match: MatchMode = "strict") -> float:
    """1.0 when the completion's answer matches `answer` (str or number) in `match` mode, else 0.0."""
    reference = extract_answer(str(answer)) if isinstance(answer, str) else str(answer)
    if match == "strict":
        return 1.0 if answers_equal(extract_answer(completion), reference) else 0.0
    if match != "flexible":
        raise ValueError(f"match: expected 'strict' or 'flexible', got {match!r}")
    region = extract_answer(completion) if has_marker(completion) else completion
    return 1.0 if flexible_equal(region, reference) else 0.0
