"""Boot the provisioned Debian kernel under qemu (TCG) and run a scenario in it.

A guest is one copy-on-write disk (``root.qcow2`` over the cached
``rootfs.img``) that persists across its boots, so a second boot is a real
reboot of the same node: same /home/kubernetes/bin/nvidia, same
/etc/ld.so.cache, fresh kernel.

Each boot:

1. a small busybox initramfs (stage 1) loads virtio/ext4, mounts the disk,
   copies this boot's payload to ``/ndi`` (scenario, runner, the installer
   package from this work tree, ``.run`` files, test modules) and any
   ``rootfs-overlay/`` files onto the root, then ``switch_root``s;
2. ``/ndi/init.sh`` runs ``/ndi/runner.py``: each step is a shell command,
   reported as ``MARK step <json>`` on the serial console (rc, output tails,
   the kernel messages it caused, /proc/modules);
3. the guest syncs, remounts / read-only and powers off; qemu exits.

qemu runs with ``-nic none``, single-threaded TCG (``-accel tcg,thread=single``:
see ``ACCEL`` and tests/vm/README.md, "Why single-threaded TCG") and a bounded
timeout; the serial log is kept in the guest's work dir (``serial-<n>-<name>.log``).
A kernel that oopses or panics before the payload's first marker is told apart
from a test failure (``BootResult.crashed_before_payload``) and its qemu is stopped
at once instead of running into the timeout.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import re
import shutil
import signal
import subprocess
import time
import tomllib
from pathlib import Path

from tests.vm.provision import REPO, VMAssets

HERE = Path(__file__).resolve().parent
GUEST_SRC = HERE / "guest"
GUEST_PYTHON_PATHS = ("/ndi/site", "/opt/ndi/deps")
# A boot's bound. The first install compiles in the guest: 1.5-2.5 min before (multi-
# threaded TCG), 3.8 min single-threaded at load 7, and not done after 8 min at load 10-12
# (2 cores; issue 43), hence 20 min; a kernel that crashes before the payload is stopped
# within seconds (_wait).
DEFAULT_TIMEOUT_S = float(os.environ.get("NDI_VM_BOOT_TIMEOUT", "1200"))
# Multi-threaded TCG (qemu's default for x86 guests on an x86 host: accel/tcg/tcg-all.c,
# default_mttcg_enabled) runs each vCPU on its own host thread; the 6.12 guest then died
# at boot on an int3 left by text_poke_bp (arch/x86/kernel/alternative.c) that the other
# vCPU still executed after the patch had finished. One TCG thread for all vCPUs runs them
# in turn, so no vCPU is inside translated code while another rewrites it.
# NDI_VM_ACCEL overrides it (e.g. "kvm" on a developer machine; CI measures the default).
ACCEL = os.environ.get("NDI_VM_ACCEL", "tcg,thread=single")
# Kernel messages that mean the guest kernel itself died (arch/x86/kernel/dumpstack.c
# __die_header "Oops: ...", kernel/panic.c "Kernel panic - not syncing", lib/bug.c
# "kernel BUG at", arch/x86/kernel/traps.c "general protection fault").
_CRASH = re.compile(r"(Oops: |Kernel panic - not syncing|kernel BUG at |BUG: unable to handle"
                    r"|general protection fault)")
# The payload's first marker (tests/vm/guest/stage1-init.sh): user space has started.
FIRST_MARK = "MARK stage1"
CRASH_GRACE_S = 3.0  # after a crash line, time for the rest of the trace to reach the log


class BootError(AssertionError):
    """The guest did not finish its scenario (timeout, panic, runner crash)."""


def crash_before_payload(serial: str) -> str | None:
    """The guest kernel's crash report when it came before the payload's first marker
    (a kernel that died before any of our code ran), else None."""
    first = serial.find(FIRST_MARK)
    head = serial if first < 0 else serial[:first]
    m = _CRASH.search(head)
    if m is None:
        return None
    start = head.rfind("\n", 0, m.start()) + 1
    return "\n".join(head[start:].splitlines()[:40])


@dataclasses.dataclass
class StepResult:
    name: str
    rc: int | str
    seconds: float
    stdout: str
    stderr: str
    dmesg: list[str]
    modules: str

    @property
    def output(self) -> str:
        return self.stdout + self.stderr

    def loaded(self) -> dict[str, dict]:
        """/proc/modules after the step: name -> {refcnt, used_by}."""
        out = {}
        for line in self.modules.splitlines():
            f = line.split()
            if len(f) >= 4:
                users = [u for u in f[3].split(",") if u and u != "-"]
                out[f[0]] = {"refcnt": int(f[2]), "used_by": users}
        return out

    def json_events(self) -> list[dict]:
        """Structured log lines (JSON objects) the step printed on stdout/stderr."""
        events = []
        for line in self.output.splitlines():
            line = line.strip()
            if line.startswith("{") and line.endswith("}"):
                with contextlib.suppress(ValueError):
                    events.append(json.loads(line))
        return events

    def json_doc(self) -> dict:
        """The step's stdout as one JSON document (probe steps)."""
        for line in reversed(self.stdout.splitlines()):
            if line.startswith("{"):
                return json.loads(line)
        raise AssertionError(f"no JSON document in the output of {self.describe()}")

    def describe(self) -> str:
        return (
            f"step {self.name}: rc={self.rc} in {self.seconds}s\n"
            f"--- stdout\n{self.stdout[-3000:]}\n--- stderr\n{self.stderr[-3000:]}\n"
            f"--- dmesg\n" + "\n".join(self.dmesg[-40:])
        )


@dataclasses.dataclass
class BootResult:
    name: str
    serial_log: Path
    serial: str
    seconds: float
    qemu_rc: int | None
    timed_out: bool
    steps: dict[str, StepResult]
    marks: list[str]

    @property
    def finished(self) -> bool:
        return any(m == "scenario-done" for m in self.marks)

    @property
    def crashed_before_payload(self) -> str | None:
        """The kernel's crash report if it died before the payload's first marker."""
        return crash_before_payload(self.serial)

    def failure(self) -> str:
        """Why the scenario did not finish, in words that never blame our module for a
        guest kernel that died before the test ran."""
        crash = self.crashed_before_payload
        if crash is not None:
            return (f"guest kernel crashed before the test ran (boot {self.name!r}, before "
                    f"{FIRST_MARK!r}; not a failure of the code under test); serial log "
                    f"{self.serial_log}:\n{crash}")
        return (f"the guest did not finish boot {self.name!r} (timed out: {self.timed_out}, "
                f"qemu rc {self.qemu_rc}); serial log {self.serial_log}:\n" + self.serial[-6000:])

    def step(self, name: str) -> StepResult:
        if name not in self.steps:
            raise BootError(
                f"boot {self.name!r} has no result for step {name!r} "
                f"(finished={self.finished}, timed_out={self.timed_out}); "
                f"serial log {self.serial_log}:\n{self.serial[-4000:]}"
            )
        return self.steps[name]


@dataclasses.dataclass
class Step:
    name: str
    sh: str
    timeout: float = 600
    env: dict[str, str] = dataclasses.field(default_factory=dict)

    def to_json(self) -> dict:
        return dataclasses.asdict(self)


def parse_serial(text: str) -> tuple[list[str], dict[str, StepResult]]:
    marks: list[str] = []
    steps: dict[str, StepResult] = {}
    for line in text.splitlines():
        idx = line.find("MARK ")
        if idx < 0:
            continue
        body = line[idx + 5 :].rstrip("\r")
        if body.startswith("step {"):
            try:
                rec = json.loads(body[5:])
            except ValueError:
                marks.append("step-unparsable")
                continue
            steps[rec["name"]] = StepResult(**rec)
            marks.append(f"step {rec['name']}")
        else:
            marks.append(body)
    return marks, steps


def _entry_point() -> str:
    data = tomllib.loads((REPO / "pyproject.toml").read_text())
    return data["project"]["scripts"]["nvidia-driver-installer"]


def make_data_disk(src: Path, image: Path) -> Path:
    """A raw ext4 image of ``src`` (``mkfs.ext4 -d``), sized to fit, for ``boot(data_disk=)``."""
    used = sum(p.stat().st_size for p in src.rglob("*") if p.is_file() and not p.is_symlink())
    size_mib = used * 5 // 4 // 2**20 + 64
    image.unlink(missing_ok=True)
    subprocess.run(["mkfs.ext4", "-q", "-F", "-L", "ndi-data", "-d", str(src), str(image),
                    f"{size_mib}M"], check=True, capture_output=True)
    return image


def _wait(proc: subprocess.Popen, log: Path, timeout: float) -> tuple[int, bool]:
    """Wait for qemu (bounded by ``timeout``); stop it early when the guest kernel
    crashed before the payload started, since nothing after that can succeed."""
    deadline = time.monotonic() + timeout
    crashed_at = None
    watching = True  # until the payload's first marker: after it, a crash is the test's
    while True:
        try:
            return proc.wait(timeout=1.0), False
        except subprocess.TimeoutExpired:
            pass
        now = time.monotonic()
        if watching and crashed_at is None and log.exists():
            text = log.read_text(errors="replace")
            watching = FIRST_MARK not in text
            if crash_before_payload(text) is not None:
                crashed_at = now
        late = crashed_at is not None and now - crashed_at > CRASH_GRACE_S
        if late or now > deadline:
            os.killpg(proc.pid, signal.SIGKILL)
            return proc.wait(), not late


def _cpio(src: Path, dest: Path) -> None:
    files = subprocess.run(["find", ".", "-mindepth", "1"], cwd=src, capture_output=True, check=True).stdout
    with open(dest, "wb") as out:
        subprocess.run(
            ["cpio", "--quiet", "-o", "-H", "newc", "-R", "0:0"],
            cwd=src,
            input=files,
            stdout=out,
            check=True,
        )


class GuestVM:
    """One guest "node": a persistent disk booted as often as a test needs."""

    def __init__(
        self,
        assets: VMAssets,
        workdir: Path,
        *,
        memory: str = "1536M",
        smp: int = 2,
        cpu: str = os.environ.get("NDI_VM_CPU", "qemu64"),
        accel: str = ACCEL,
    ) -> None:
        self.assets = assets
        self.accel = accel
        self.workdir = workdir
        self.memory = memory
        self.smp = smp
        self.cpu = cpu
        self.boots: list[BootResult] = []
        workdir.mkdir(parents=True, exist_ok=True)
        self.disk = workdir / "root.qcow2"
        if not self.disk.exists():
            subprocess.run(
                [
                    "qemu-img",
                    "create",
                    "-q",
                    "-f",
                    "qcow2",
                    "-F",
                    "raw",
                    "-b",
                    str(assets.rootfs_image),
                    str(self.disk),
                ],
                check=True,
                capture_output=True,
            )

    # ------------------------------------------------------------ payload

    def _stage1(self, root: Path) -> None:
        bb = shutil.which("busybox") or "/bin/busybox"
        (root / "bin").mkdir(parents=True)
        shutil.copy2(bb, root / "bin/busybox")
        applets = subprocess.run([bb, "--list"], capture_output=True, text=True, check=True).stdout.split()
        for applet in applets:
            # Never the name "busybox" itself: the link would replace the binary.
            if applet != "busybox" and "/" not in applet:
                (root / "bin" / applet).symlink_to("busybox")
        for d in ("proc", "sys", "dev", "newroot"):
            (root / d).mkdir()
        shutil.copy2(GUEST_SRC / "stage1-init.sh", root / "init")
        (root / "init").chmod(0o755)
        for rel in self.assets.boot_modules:
            dst = root / "modules" / rel
            dst.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(self.assets.modules_dir / rel, dst)
        (root / "boot-modules.txt").write_text("\n".join(self.assets.boot_modules) + "\n")

    def _payload(
        self,
        payload: Path,
        name: str,
        steps: list[Step],
        files: dict[str, Path],
        env: dict[str, str],
    ) -> None:
        payload.mkdir(parents=True)
        for script, mode in (("init.sh", 0o755), ("runner.py", 0o644), ("probe.py", 0o644)):
            shutil.copy2(GUEST_SRC / script, payload / script)
            (payload / script).chmod(mode)
        scenario = {"name": name, "env": env, "steps": [s.to_json() for s in steps]}
        (payload / "scenario.json").write_text(json.dumps(scenario, indent=1))
        # The installer package from this work tree (its deps are in the image).
        shutil.copytree(
            REPO / "installer",
            payload / "site" / "installer",
            ignore=shutil.ignore_patterns("__pycache__", "*.pyc"),
        )
        self._compile(payload / "site")
        for rel, src in files.items():
            dst = payload / "files" / rel
            dst.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dst)
        overlay = payload / "rootfs-overlay"
        pth = overlay / f"usr/local/lib/python{self.assets.guest_python}/dist-packages/ndi.pth"
        pth.parent.mkdir(parents=True)
        pth.write_text("\n".join(GUEST_PYTHON_PATHS) + "\n")
        module, _, func = _entry_point().partition(":")
        cli = overlay / "usr/local/bin/nvidia-driver-installer"
        cli.parent.mkdir(parents=True)
        cli.write_text(
            "#!/usr/bin/python3\n"
            "import sys\n"
            f"from {module} import {func}\n"
            "sys.argv[0] = 'nvidia-driver-installer'\n"
            f"sys.exit({func}())\n"
        )
        cli.chmod(0o755)

    def _compile(self, site: Path) -> None:
        """Byte-compile the installer here when this python3 is the guest's version."""
        py = "/usr/bin/python3"
        if not os.path.exists(py):
            return
        ver = subprocess.run(
            [py, "-c", "import sys; print('%d.%d' % sys.version_info[:2])"],
            capture_output=True,
            text=True,
        ).stdout.strip()
        if ver == self.assets.guest_python:
            subprocess.run(
                [py, "-m", "compileall", "-q", "--invalidation-mode", "unchecked-hash", str(site)],
                check=True,
                capture_output=True,
            )

    # --------------------------------------------------------------- boot

    def boot(
        self,
        name: str,
        steps: list[Step],
        *,
        files: dict[str, Path] | None = None,
        env: dict[str, str] | None = None,
        timeout: float = DEFAULT_TIMEOUT_S,
        cmdline: str = "",
        data_disk: Path | None = None,
    ) -> BootResult:
        """Boot once, run ``steps`` in order, power off; ``files`` land in /ndi/files/.

        ``cmdline``: more kernel command line (e.g. ``module.sig_enforce=1``).
        ``data_disk``: a raw ext4 image attached read-only as /dev/vdb, for files too
        big for the initramfs (NVIDIA's real modules: ~150 MB a driver).
        """
        n = len(self.boots) + 1
        tag = f"{n}-{re.sub(r'[^A-Za-z0-9_.-]', '_', name)}"
        stage = self.workdir / f"initrd-{tag}"
        if stage.exists():
            shutil.rmtree(stage)
        self._stage1(stage)
        self._payload(stage / "payload", name, steps, files or {}, env or {})
        initrd = self.workdir / f"initrd-{tag}.cpio"
        _cpio(stage, initrd)
        shutil.rmtree(stage)
        log = self.workdir / f"serial-{tag}.log"
        log.unlink(missing_ok=True)
        argv = [
            "qemu-system-x86_64",
            "-machine",
            "pc",
            "-accel",
            self.accel,
            "-cpu",
            self.cpu,
            "-m",
            self.memory,
            "-smp",
            str(self.smp),
            "-nic",
            "none",
            "-no-reboot",
            "-display",
            "none",
            "-monitor",
            "none",
            "-serial",
            f"file:{log}",
            "-kernel",
            str(self.assets.vmlinuz),
            "-initrd",
            str(initrd),
            "-append",
            f"console=ttyS0 loglevel=3 panic=-1 ndi.boot={n} {cmdline}".strip(),
            "-drive",
            f"file={self.disk},if=virtio,format=qcow2,cache=unsafe",
        ]
        if data_disk is not None:
            argv += ["-drive", f"file={data_disk},if=virtio,format=raw,readonly=on"]
        t0 = time.monotonic()
        with open(self.workdir / f"qemu-{tag}.stderr", "wb") as err:
            proc = subprocess.Popen(argv, stdout=err, stderr=err, start_new_session=True)
            rc, timed_out = _wait(proc, log, timeout)
        seconds = round(time.monotonic() - t0, 1)
        initrd.unlink(missing_ok=True)
        serial = log.read_text(errors="replace") if log.exists() else ""
        marks, results = parse_serial(serial)
        result = BootResult(name, log, serial, seconds, rc, timed_out, results, marks)
        self.boots.append(result)
        return result
