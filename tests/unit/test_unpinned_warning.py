"""The artifacts_unpinned warning follows what a plan runs, not a list of kind names: a
plan that downloads NVIDIA's .run and runs it as root says so when nothing pins it."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from structlog.testing import capture_logs

from installer.commands import install
from installer.plan import Plan
from installer.settings import Settings

URL = "https://127.0.0.1/NVIDIA-Linux-x86_64-535.183.01.run"


class _NoOwnArtifacts:
    def unpinned_artifacts(self, settings: Settings) -> str | None:
        return None


def _warnings(plan: Plan, settings: Settings) -> list[dict[str, object]]:
    ctx = SimpleNamespace(settings=settings)
    with capture_logs() as logs:
        install._warn_unpinned(ctx, plan, _NoOwnArtifacts())
    return [e for e in logs if e["event"] == "artifacts_unpinned"]


@pytest.mark.parametrize("kind", ["fresh", "staged"])
def test_a_plan_that_runs_a_downloaded_run_warns_when_unpinned(kind):
    plan = Plan(kind, (), driver_version="535.183.01", driver_url=URL)
    assert plan.runs_downloaded_run
    [warned] = _warnings(plan, Settings())
    assert warned["unpinned"] == ["the NVIDIA .run (--driver-sha256)"]
    assert warned["driver_url"] == URL


@pytest.mark.parametrize("kind", ["fresh", "staged"])
def test_a_pinned_run_is_not_warned_about(kind):
    plan = Plan(kind, (), driver_version="535.183.01", driver_url=URL)
    assert _warnings(plan, Settings(driver_sha256="a" * 64)) == []
    assert _warnings(Plan(kind, (), driver_sha256="a" * 64, driver_url=URL), Settings()) == []


@pytest.mark.parametrize("kind", ["cached", "preload", "bundle"])
def test_a_plan_that_runs_no_downloaded_run_does_not_warn(kind):
    plan = Plan(kind, (), driver_version="535.183.01")
    assert not plan.runs_downloaded_run
    assert _warnings(plan, Settings()) == []
