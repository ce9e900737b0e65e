"""The example alert rules (docs/examples/prometheus-alerts.yaml) parse as a Prometheus rule
file and name only metrics the health sidecar serves (a renamed gauge breaks an alert
silently: Prometheus evaluates an unknown series as no data, never as an error)."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest
import yaml

from tests.unit.test_health import health_metric_names

RULES = Path(__file__).parents[2] / "docs/examples/prometheus-alerts.yaml"
# PromQL's own words, and the functions the rules call (followed by "(": not a metric).
KEYWORDS = {"by", "without", "on", "ignoring", "group_left", "group_right", "bool", "and",
            "or", "unless", "offset"}
_STRING = re.compile(r'"(?:[^"\\]|\\.)*"')
_NAME = re.compile(r"[A-Za-z_:][A-Za-z0-9_:]*")


def metric_names(expr: str) -> set[str]:
    """The metric names a PromQL expression selects: identifiers outside strings, label
    matchers ({...}), ranges ([5m]) and by/without lists, not called as a function."""
    text = _STRING.sub('""', expr)
    text = re.sub(r"\{[^}]*\}|\[[^\]]*\]", " ", text)
    text = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", " ", text)
    names = set()
    for m in _NAME.finditer(text):
        rest = text[m.end():].lstrip()
        if m.group() not in KEYWORDS and not rest.startswith("(") and not (
                m.start() and text[m.start() - 1].isdigit()):
            names.add(m.group())
    return names


def alerts() -> list[dict]:
    doc = yaml.safe_load(RULES.read_text())
    return [rule for group in doc["groups"] for rule in group["rules"]]


def test_the_rule_file_has_the_shape_prometheus_loads():
    doc = yaml.safe_load(RULES.read_text())
    assert set(doc) == {"groups"} and all(set(g) == {"name", "rules"} for g in doc["groups"])
    for rule in alerts():
        assert set(rule) <= {"alert", "expr", "for", "labels", "annotations"}, rule
        assert rule["alert"] and rule["expr"] and rule["labels"]["severity"], rule
        if "for" in rule:
            assert re.fullmatch(r"\d+[smhd]", rule["for"]), rule


@pytest.mark.parametrize("rule", alerts(), ids=lambda r: r["alert"])
def test_each_alert_names_only_metrics_that_exist(rule):
    names = metric_names(rule["expr"])
    assert names, rule["expr"]
    assert names <= set(health_metric_names()), names - set(health_metric_names())


def test_the_name_finder_sees_through_promql():
    assert metric_names('time() - a_b{x="y{z}"} > 300 and on (node) c[5m] offset 1m') == {
        "a_b", "c"}
    assert metric_names("sum by (daemon) (nope_total) == 0") == {"nope_total"}


def test_promtool_passes_the_rules_and_the_sidecars_metrics(tmp_path):
    """Prometheus's own checker (Debian's promtool, tests/fixtures/realprometheus.py): the
    rule file loads, and the exposition text (every metric, with labels) lints clean."""
    from installer.records import metrics
    from installer.records.outcome import Outcome
    from installer.services import health
    from tests.fixtures import realprometheus

    promtool = str(realprometheus.promtool())
    rules = subprocess.run([promtool, "check", "rules", str(RULES)], capture_output=True,
                           text=True, timeout=60)
    assert rules.returncode == 0 and f"SUCCESS: {len(alerts())} rules found" in rules.stdout, (
        rules.stdout + rules.stderr)
    text = metrics.format_metrics(
        Outcome("ok", driver_version="580.95.05", plan="fresh", staged_driver_version="580.105.08"),
        kernel_release="6.8.0-1015-gcp") + health.format_gauges(
        health.Health(0.0, "580.95.05", "580.105.08", 2, 1, {("79", "reboot"): 1, ("13", "app"): 2},
                      {"persistenced": "exited"}, ("GPU gone",), "reboot"))
    lint = subprocess.run([promtool, "check", "metrics"], input=text, capture_output=True,
                          text=True, timeout=60)
    assert lint.returncode == 0 and not lint.stdout.strip() and not lint.stderr.strip(), (
        lint.stdout + lint.stderr)
    # The check can fail: a counter without its _total suffix is one of promtool's lints.
    broken = subprocess.run([promtool, "check", "metrics"], input=text.replace(
        "health_problems gauge", "health_problems counter"), capture_output=True, text=True,
        timeout=60)
    assert "_total" in broken.stdout + broken.stderr, broken
