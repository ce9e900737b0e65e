"""The pod tier's kubelet order (tests/pod_tier/lifecycle.py) on a fake runtime: runs in the
default test run, no podman needed."""

from __future__ import annotations

import pytest

from tests.fixtures.clock import Clock
from tests.pod_tier.lifecycle import BACKOFF_S, FAILED, RUNNING, PodLifecycle


class FakeRuntime:
    """Each regular init container runs for ``polls`` state reads, is "stopped" for one
    (podman's state before its cleanup recorded the exit code: -1 here), then exits with its
    code; sidecars and main containers run until stopped (or ``crash``)."""

    def __init__(self, exit_codes: dict[str, int], polls: int = 2):
        self.exit_codes, self.polls = exit_codes, polls
        self.status: dict[str, str] = {}
        self.reads: dict[str, int] = {}
        self.log: list[tuple[str, str]] = []
        self.refuse: set[str] = set()

    def start(self, name: str) -> None:
        self.log.append(("start", name))
        if name in self.refuse:
            raise AssertionError(f"podman start {name}: rc 125")
        self.status[name], self.reads[name] = "running", 0

    def state(self, name: str) -> tuple[str, int]:
        status = self.status.get(name, "created")
        if status in ("running", "stopped") and name in self.exit_codes:
            self.reads[name] += 1
            if self.reads[name] > self.polls:
                self.status[name] = status = "stopped" if status == "running" else "exited"
        code = {"exited": self.exit_codes.get(name, 0), "stopped": -1}.get(status, 0)
        return status, code

    def stop(self, name: str, grace_s: float) -> None:
        self.log.append(("stop", name))
        self.status[name] = "exited"

    def crash(self, name: str) -> None:
        self.status[name] = "exited"


SPEC = {"initContainers": [{"name": "fm", "restartPolicy": "Always"},
                           {"name": "pd", "restartPolicy": "Always"},
                           {"name": "install"}],
        "containers": [{"name": "pause"}]}


def lifecycle(runtime: FakeRuntime, clock: Clock) -> PodLifecycle:
    return PodLifecycle(SPEC, runtime, clock=clock, sleep=clock.sleep)


def test_sidecars_start_first_the_main_container_after_the_install_succeeded():
    runtime, clock = FakeRuntime({"install": 0}), Clock()
    life = lifecycle(runtime, clock)
    assert life.start(60, keeper=False) == RUNNING
    assert runtime.log == [("start", "fm"), ("start", "pd"), ("start", "install"),
                           ("start", "pause")]
    assert runtime.status["fm"] == runtime.status["pd"] == "running"  # alongside pause
    life.terminate()


def test_a_failed_install_fails_the_pod_and_stops_its_sidecars_in_reverse():
    runtime, clock = FakeRuntime({"install": 9}), Clock()
    life = lifecycle(runtime, clock)
    assert life.start(60, keeper=False) == FAILED and life.failed == "install"
    assert ("start", "pause") not in runtime.log
    assert runtime.log[-2:] == [("stop", "pd"), ("stop", "fm")]


def test_termination_stops_main_containers_then_sidecars_in_reverse_order():
    runtime, clock = FakeRuntime({"install": 0}), Clock()
    life = lifecycle(runtime, clock)
    life.start(60, keeper=False)
    life.terminate()
    assert runtime.log[-3:] == [("stop", "pause"), ("stop", "pd"), ("stop", "fm")]


def test_a_sidecar_that_exits_is_started_again_after_the_kubelets_backoff():
    runtime, clock = FakeRuntime({"install": 0}), Clock()
    life = lifecycle(runtime, clock)
    life.start(60, keeper=False)  # this test drives the clock
    for restarts, backoff in ((1, BACKOFF_S), (2, 2 * BACKOFF_S)):
        runtime.crash("pd")
        life.keep_sidecars_once()  # notices: due after the backoff
        clock.now += backoff - 1
        life.keep_sidecars_once()
        assert runtime.status["pd"] == "exited"
        clock.now += 1
        life.keep_sidecars_once()
        assert runtime.status["pd"] == "running" and life.restarts["pd"] == restarts
    life.terminate()


def test_an_install_past_the_deadline_stops_the_pod():
    runtime, clock = FakeRuntime({"install": 0}, polls=10**6), Clock()
    life = lifecycle(runtime, clock)
    with pytest.raises(TimeoutError, match="install still running"):
        life.start(5, keeper=False)
    assert [s for s in runtime.log if s[0] == "stop"] == [("stop", "install"), ("stop", "pd"),
                                                          ("stop", "fm")]


def test_a_sidecar_with_a_startup_probe_is_refused_not_assumed_started():
    spec = {"initContainers": [{"name": "fm", "restartPolicy": "Always",
                                "startupProbe": {"exec": {"command": ["true"]}}}],
            "containers": [{"name": "pause"}]}
    runtime, clock = FakeRuntime({}), Clock()
    with pytest.raises(NotImplementedError, match="startup probes"):
        PodLifecycle(spec, runtime, clock=clock, sleep=clock.sleep).start(5)
    assert runtime.log == []


def test_a_restart_the_runtime_refuses_is_tried_again_after_a_longer_backoff():
    runtime, clock = FakeRuntime({"install": 0}), Clock()
    life = lifecycle(runtime, clock)
    life.start(60, keeper=False)
    runtime.crash("fm")
    runtime.refuse.add("fm")
    life.keep_sidecars_once()
    clock.now += BACKOFF_S
    life.keep_sidecars_once()
    assert life.restarts["fm"] == 0 and life.start_errors == ["fm: podman start fm: rc 125"]
    runtime.refuse.clear()
    life.keep_sidecars_once()  # the next try is due 2 x the backoff later
    clock.now += 2 * BACKOFF_S - 1
    life.keep_sidecars_once()
    assert runtime.status["fm"] == "exited"
    clock.now += 1
    life.keep_sidecars_once()
    assert runtime.status["fm"] == "running" and life.restarts["fm"] == 1
