"""One pod's containers started, kept and stopped in the kubelet's order, over podman.

podman 4.3.1's `kube play` runs the init containers one after the other, each to completion:
it has no native sidecars, and a sidecar (an init container with ``restartPolicy: Always``,
KEP-753, on by default since Kubernetes 1.29) that never exits would hold the pod forever.
So the tier creates the pod with ``kube play --start=false`` and starts its containers the
way the kubelet does (kubernetes/kubernetes, checked against its source):

- pkg/kubelet/kuberuntime/kuberuntime_container.go, computeInitContainerActions: init
  containers start in spec order. A regular one must exit 0 before the next starts; one that
  fails in a pod of ``restartPolicy: Never`` kills the pod (KillPod). A restartable one (a
  sidecar) lets the next one start as soon as it is running and its startupProbe, if any,
  succeeded; a sidecar that exited is started again, during and after initialisation.
- k8s.io/api core/v1 Container.restartPolicy: a sidecar is restarted on exit until every
  regular container has terminated, then shut down.
- pkg/kubelet/kubelet.go: restarts back off from backOffPeriod (10 s), doubling up to
  MaxContainerBackOff (300 s).
- pkg/kubelet/kuberuntime/kuberuntime_termination_order.go, newTerminationOrdering: at
  termination the main containers stop first, then the sidecars in reverse spec order, each
  waiting for the ones after it.

Not modelled: probes (no manifest of ours has one; a sidecar with a startupProbe is refused
rather than started as if it had passed), restarts of regular containers, resizes.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

BACKOFF_S, MAX_BACKOFF_S = 10.0, 300.0  # kubelet.go backOffPeriod, MaxContainerBackOff
POLL_S = 0.5
RUNNING, FAILED = "Running", "Failed"  # the pod phases this harness reaches


class Runtime(Protocol):
    """The container runtime, by container name within the pod."""

    def start(self, name: str) -> None: ...

    def state(self, name: str) -> tuple[str, int]:
        """(status: created, running, exited..., exit code)."""
        ...

    def stop(self, name: str, grace_s: float) -> None: ...


def is_sidecar(container: dict) -> bool:
    """podutil.IsRestartableInitContainer: an init container with restartPolicy Always."""
    return container.get("restartPolicy") == "Always"


@dataclass
class PodLifecycle:
    spec: dict  # the Pod's spec
    runtime: Runtime
    clock: Callable[[], float] = time.monotonic
    sleep: Callable[[float], None] = time.sleep
    phase: str = "Pending"
    failed: str | None = None  # the init container whose failure failed the pod
    restarts: dict[str, int] = field(default_factory=dict)  # sidecar -> restarts so far
    start_errors: list[str] = field(default_factory=list)  # restarts the runtime refused
    _attempts: dict[str, int] = field(default_factory=dict)  # restarts tried: the backoff
    _sidecars: list[str] = field(default_factory=list)  # started, in spec order
    _next_start: dict[str, float] = field(default_factory=dict)
    _stop: threading.Event = field(default_factory=threading.Event)
    _keeper: threading.Thread | None = None

    def start(self, deadline_s: float, *, keeper: bool = True) -> str:
        """Initialise the pod and start its main containers; its phase (Running or Failed).
        ``keeper``: a thread restarts the sidecars from then on (else keep_sidecars_once)."""
        end = self.clock() + deadline_s
        for c in self.spec.get("initContainers", []):
            if is_sidecar(c) and c.get("startupProbe"):
                raise NotImplementedError(f"{c['name']}: startup probes are not modelled here")
            self.runtime.start(c["name"])
            if is_sidecar(c):
                self._sidecars.append(c["name"])
                self.restarts[c["name"]] = 0
                self._until(end, c["name"], lambda s: s == "running")
            else:
                # podman says "stopped" until its cleanup has recorded the exit code.
                _, code = self._until(end, c["name"], lambda s: s == "exited")
                if code != 0:  # restartPolicy Never: KillPod
                    self.phase, self.failed = FAILED, c["name"]
                    self.terminate()
                    return self.phase
        for c in self.spec["containers"]:
            self.runtime.start(c["name"])
        self.phase = RUNNING
        if keeper and self._sidecars:
            self._keeper = threading.Thread(target=self._keep_sidecars, daemon=True,
                                            name="sidecar-keeper")
            self._keeper.start()
        return self.phase

    def keep_sidecars_once(self) -> None:
        """Start again each sidecar that exited, once its backoff has passed."""
        for name in self._sidecars:
            if self._stop.is_set():
                return
            status, _ = self.runtime.state(name)
            if status == "running":
                continue
            now = self.clock()
            due = self._next_start.setdefault(name, now + self._backoff(name))
            if now >= due:
                del self._next_start[name]
                self._attempts[name] = self._attempts.get(name, 0) + 1
                try:
                    self.runtime.start(name)
                except Exception as exc:  # as the kubelet: tried again after a longer backoff
                    self.start_errors.append(f"{name}: {exc}")
                    continue
                self.restarts[name] += 1

    def terminate(self, grace_s: float = 10) -> None:
        """Stop the pod: no more restarts; the main containers (and an init container still
        running), then the sidecars in reverse."""
        self._stop.set()
        if self._keeper is not None:
            self._keeper.join(timeout=30)
        regular = [c["name"] for c in self.spec.get("initContainers", []) if not is_sidecar(c)]
        names = [c["name"] for c in self.spec["containers"]] + regular + self._sidecars[::-1]
        for name in names:
            if self.runtime.state(name)[0] == "running":
                self.runtime.stop(name, grace_s)

    def _backoff(self, name: str) -> float:
        return min(BACKOFF_S * 2 ** self._attempts.get(name, 0), MAX_BACKOFF_S)

    def _until(self, end: float, name: str, done: Callable[[str], bool]) -> tuple[str, int]:
        """Poll ``name`` until ``done(status)``, keeping the sidecars meanwhile; at ``end``
        the pod is stopped and the wait fails."""
        while True:
            status, code = self.runtime.state(name)
            if done(status):
                return status, code
            if self.clock() >= end:
                self.terminate()
                raise TimeoutError(f"init container {name} still {status} at the deadline")
            self.keep_sidecars_once()
            self.sleep(POLL_S)

    def _keep_sidecars(self) -> None:
        while not self._stop.wait(1.0):
            self.keep_sidecars_once()
