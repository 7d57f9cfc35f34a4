"""Reading the PromQL of deploy/: the vector selectors of an expression, the queries of the Grafana
dashboard with its variables filled in, and the alert annotations rendered for expected labels.

Enough PromQL for the expressions deploy/ holds (not a parser): tests/unit/test_deploy.py checks
every metric they name is one the worker exports, and tests/integration/worker/obs/test_dashboards.py
asks a real Prometheus for each selector and query.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[2]
DASHBOARD = ROOT / "deploy" / "grafana" / "vela2-dashboard.json"
ALERTS = ROOT / "deploy" / "prometheus" / "alerts.yml"

# Words of PromQL that are not metric names; after those in LABEL_LISTS comes a list of label names.
LABEL_LISTS = {"by", "without", "on", "ignoring", "group_left", "group_right"}
# Aggregations may have their `by (...)` before their `(`: `sum by (le) (x)`.
AGGREGATIONS = {"sum", "min", "max", "avg", "group", "stddev", "stdvar", "count", "count_values", "bottomk", "topk",
                "quantile"}
KEYWORDS = LABEL_LISTS | AGGREGATIONS | {"and", "or", "unless", "bool", "offset", "atan2", "inf", "nan"}
# Grafana's own variables, as the test fills them (a range of a few scrapes; the whole hour).
GRAFANA_BUILTINS = {"__rate_interval": "1m", "__interval": "15s", "__range": "1h"}
_TOKENS = re.compile(r"""(?P<str>"(?:\\.|[^"\\])*"|'(?:\\.|[^'\\])*'|`[^`]*`)|(?P<num>\d[\w.]*)"""
                     r"""|(?P<ident>[A-Za-z_:][\w:]*)|(?P<space>\s+)|(?P<other>.)""", re.S)
_MATCHER = re.compile(r"""\s*([A-Za-z_]\w*)\s*(=~|!~|!=|=)\s*("(?:\\.|[^"\\])*")\s*,?""")
_VARIABLE = re.compile(r"\$\{(\w+)(?::\w+)?\}|\$(\w+)")


@dataclass(frozen=True)
class Selector:
    """One vector selector: the metric name and its label matchers as written (`{...}` or "")."""

    name: str
    matchers: str = ""

    def __str__(self) -> str:
        return self.name + self.matchers

    def matches(self) -> list[tuple[str, str, str]]:
        """(label, operator, value) per matcher, the value unquoted."""
        inner = self.matchers[1:-1] if self.matchers else ""
        found = [(m.group(1), m.group(2), json.loads(m.group(3))) for m in _MATCHER.finditer(inner)]
        assert "".join(m.group(0) for m in _MATCHER.finditer(inner)).strip() == inner.strip(), self
        return found


def selectors(expr: str) -> list[Selector]:
    """The vector selectors of `expr` in order (a function or aggregation is a name before `(`;
    the names after by/on/... are labels; strings and numbers are neither)."""
    tokens = [(m.lastgroup, m.group()) for m in _TOKENS.finditer(expr) if m.lastgroup != "space"]
    found: list[Selector] = []
    i = 0
    while i < len(tokens):
        kind, text = tokens[i]
        nxt = tokens[i + 1][1] if i + 1 < len(tokens) else ""
        i += 1
        if kind == "ident" and text.lower() in LABEL_LISTS and nxt == "(":
            while tokens[i][1] != ")":  # the label names of by (...), on (...), ...
                i += 1
        elif kind == "ident" and text.lower() not in KEYWORDS and nxt != "(":
            matchers = ""
            if nxt == "{":
                while tokens[i][1] != "}":
                    matchers += tokens[i][1]
                    i += 1
                matchers += "}"
            found.append(Selector(text, matchers))
    return found


def dashboard() -> dict[str, Any]:
    """deploy/grafana/vela2-dashboard.json."""
    return json.loads(DASHBOARD.read_text())


def panels(board: dict[str, Any]) -> list[dict[str, Any]]:
    """Every panel of the dashboard, those inside collapsed rows included (rows themselves not)."""
    out = []
    for p in board["panels"]:
        if p.get("type") == "row":
            out += p.get("panels", [])
        else:
            out.append(p)
    return out


def queries(board: dict[str, Any]) -> list[tuple[str, str]]:
    """(panel title / refId, expr) of every Prometheus target of the dashboard."""
    return [(f"{p['title']} / {t['refId']}", t["expr"]) for p in panels(board) for t in p.get("targets", [])]


def variables(expr: str) -> set[str]:
    """The Grafana variables `expr` uses ($x, ${x}, ${x:format})."""
    return {a or b for a, b in _VARIABLE.findall(expr)}


def fill(expr: str, values: dict[str, str]) -> str:
    """`expr` with its Grafana variables replaced: `values`, then GRAFANA_BUILTINS; KeyError if one
    has no value."""
    every = {**GRAFANA_BUILTINS, **values}
    return _VARIABLE.sub(lambda m: every[m.group(1) or m.group(2)], expr)


def alert_rules() -> list[dict[str, Any]]:
    """The alerting rules of deploy/prometheus/alerts.yml, every group's."""
    doc = yaml.safe_load(ALERTS.read_text())
    return [r for g in doc["groups"] for r in g["rules"] if "alert" in r]


_LABEL_TEMPLATE = re.compile(r"\{\{\s*\$labels\.(\w+)\s*\}\}")


def render(template: str, labels: dict[str, str]) -> str:
    """An annotation template rendered as Prometheus would for an alert with `labels`: the rules use
    `{{ $labels.x }}` and nothing else of Go's templates (tests/unit/test_deploy.py checks that)."""
    return _LABEL_TEMPLATE.sub(lambda m: labels[m.group(1)], template)
