"""What a PromQL expression refers to: its metric selectors (name, label matchers) and the labels its
`by`/`without`/`on`/`ignoring`/`group_left`/`group_right` clauses name.

A tokenizer, not a full parser: enough for the dashboard's expressions (selectors, functions, aggregations,
binary operators with vector matching, range selectors, Grafana's `$variables`), and strict where it
matters: an identifier that is neither a function, an aggregation, a keyword nor a grouping clause is a
metric name. Caller: `test_monitoring.py` (the dashboard against what the code serves).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

TOKEN = re.compile(r"""\s*(?:(?P<string>"(?:[^"\\]|\\.)*"|'(?:[^'\\]|\\.)*')|(?P<range>\[[^\]]*\])"""
                   r"""|(?P<ident>[A-Za-z_:][A-Za-z0-9_:]*)|(?P<op>=~|!~|!=|==|>=|<=|[-+*/%^{}(),=<>])"""
                   r"""|(?P<number>[0-9.]+(?:e[-+]?[0-9]+)?)|(?P<var>\$\{?[A-Za-z_:]+\}?))""")
GROUPING = {"by", "without", "on", "ignoring", "group_left", "group_right"}
KEYWORDS = {"bool", "and", "or", "unless", "offset", "group_left", "group_right"}  # the last two without labels
AGGREGATIONS = {"sum", "min", "max", "avg", "count", "stddev", "stdvar", "topk", "bottomk", "quantile", "count_values",
                "group", "limitk", "limit_ratio"}  # `sum by (x) (...)`: the clause may come before the parenthesis


@dataclass
class Selector:
    metric: str
    matchers: list[tuple[str, str, str]] = field(default_factory=list)  # (label, op, value)


@dataclass
class Refs:
    selectors: list[Selector] = field(default_factory=list)
    grouping: set[str] = field(default_factory=set)  # labels of by/on/... clauses


def tokens(expr: str) -> list[tuple[str, str]]:
    out, pos = [], 0
    while pos < len(expr):
        if expr[pos:].strip() == "":
            break
        m = TOKEN.match(expr, pos)
        if m is None or m.end() == pos:
            raise ValueError(f"cannot read {expr[pos:pos + 30]!r} in {expr!r}")
        kind = m.lastgroup or ""
        out.append((kind, m.group(kind)))
        pos = m.end()
    return out


def refs(expr: str) -> Refs:
    """Every selector and grouping label of `expr`."""
    toks, got, i = tokens(expr), Refs(), 0

    def peek(k: int) -> tuple[str, str]:
        return toks[k] if k < len(toks) else ("", "")

    while i < len(toks):
        kind, text = toks[i]
        if kind != "ident":
            i += 1
            continue
        if text in GROUPING and peek(i + 1)[1] == "(":
            i += 2
            while peek(i)[1] != ")":
                if peek(i)[0] == "ident":
                    got.grouping.add(peek(i)[1])
                elif peek(i)[1] != ",":
                    raise ValueError(f"{expr!r}: {peek(i)[1]!r} in a {text}() clause")
                i += 1
            i += 1
            continue
        if text in KEYWORDS or text in AGGREGATIONS or peek(i + 1)[1] == "(":  # a keyword, function, aggregation
            i += 1
            continue
        sel = Selector(text)
        i += 1
        if peek(i)[1] == "{":
            i += 1
            while peek(i)[1] != "}":
                (lk, label), (_, op), (vk, value) = peek(i), peek(i + 1), peek(i + 2)
                if lk != "ident" or op not in ("=", "!=", "=~", "!~") or vk != "string":
                    raise ValueError(f"{expr!r}: bad matcher near {label!r}")
                sel.matchers.append((label, op, value[1:-1]))
                i += 3
                if peek(i)[1] == ",":
                    i += 1
            i += 1
        got.selectors.append(sel)
    return got


def literal_alternatives(regex: str) -> list[str] | None:
    """`a|b|c` as its alternatives when each is a plain word (a regex matcher over known values); else None."""
    parts = regex.split("|")
    return parts if all(re.fullmatch(r"[A-Za-z0-9_.-]+", p) for p in parts) else None


def legend_labels(legend: str) -> set[str]:
    return set(re.findall(r"\{\{\s*([A-Za-z_][A-Za-z0-9_]*)\s*\}\}", legend))
