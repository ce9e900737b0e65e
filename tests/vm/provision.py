"""Provision the qemu tier: host tools, one Debian kernel ABI, a guest root image.

Everything is derived at run time from this machine's apt configuration (no
mirror is named here) and cached under ``$NDI_VM_CACHE`` (default
``/var/cache/ndi-vm``), one directory per kernel ABI, so a second run takes a
second or two. Each stage records a stamp holding the hash of its recipe and
is redone only when the recipe changes.

Run by hand: ``python -m tests.vm.provision`` (prints the assets as JSON).

Layout of ``<cache>/<abi>/``::

    kernel/vmlinuz                    the kernel from linux-image-<abi>
    kernel/modules/<relpath>.ko       the few in-tree modules the tier needs
    kernel/modules/modules.{builtin,builtin.modinfo,order}
    kernel/boot-modules.txt           insmod order for the initramfs (virtio, ext4)
    rootfs/                           debootstrap tree (+ headers, gcc, kmod, python deps)
    rootfs.img                        raw ext4 image of rootfs/ (the guest's root disk base)

The ABI is pinned once: ``$NDI_VM_ABI`` if set, else the newest
``linux-headers-<abi>`` already installed whose image apt can still fetch,
else the one ``linux-headers-amd64`` depends on. Image and headers always
come from the same ABI.
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import glob
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import tomllib
from collections.abc import Callable, Iterator
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
CACHE_ROOT = Path(os.environ.get("NDI_VM_CACHE", "/var/cache/ndi-vm"))

# Host tools the tier uses (qemu-utils: qemu-img for copy-on-write disks).
HOST_PACKAGES = [
    "qemu-system-x86",
    "qemu-utils",
    "kmod",
    "cpio",
    "busybox-static",
    "debootstrap",
    "e2fsprogs",
    "makeself",
    "gcc",
    "make",
    "gzip",
]

# Installed in the guest root on top of debootstrap's minbase (the headers
# package is added with the ABI). gcc/make/kmod: kbuild and module loading;
# procps: ps/pgrep for lock-holder and debugging output; bubblewrap: the build jail
# NVIDIA's code runs in (installer/jail/run_in_jail.py), as in our images.
GUEST_PACKAGES = [
    "python3",
    "kmod",
    "util-linux",
    "procps",
    "gcc",
    "make",
    "libc6-dev",
    "ca-certificates",
    "bubblewrap",
]

# In-tree modules copied out of linux-image (with their dependencies):
# the first group is loaded by the initramfs to reach the root disk; all of
# them are installed in the guest's /lib/modules/<abi>. NVIDIA's real modules
# depend on drm (nvidia), video (nvidia-modeset) and drm_kms_helper
# (nvidia-drm; 550's built for 6.12 also drm_ttm_helper) (`modinfo -F depends`);
# overlay: the installer may capture NVIDIA's fixed paths with overlay mounts.
BOOT_MODULES = ["virtio_pci", "virtio_blk", "crc32c_generic", "ext4"]
GUEST_MODULES = BOOT_MODULES + ["drm", "drm_kms_helper", "drm_ttm_helper", "video", "overlay"]

ROOTFS_IMAGE_SIZE = "3G"  # sparse; room for builds and several driver versions

# Bump to force every stage to be redone.
RECIPE_VERSION = "1"


class ProvisionError(RuntimeError):
    """The tier cannot be provisioned on this machine (tests skip with this message)."""


@dataclasses.dataclass(frozen=True)
class VMAssets:
    abi: str  # e.g. 6.1.0-56-amd64, also the kernel release (uname -r)
    cache_dir: Path
    vmlinuz: Path
    modules_dir: Path  # kernel/modules: <relpath>.ko as in /lib/modules/<abi>/
    boot_modules: list[str]  # relpaths in insmod order
    rootfs_image: Path
    headers_dir: Path  # the host's /usr/src/linux-headers-<abi>
    guest_python: str  # e.g. "3.11"

    @property
    def kernel_release(self) -> str:
        return self.abi

    def to_json(self) -> dict:
        d = dataclasses.asdict(self)
        return {k: (str(v) if isinstance(v, Path) else v) for k, v in d.items()}


Log = Callable[[str], None]


def _default_log(msg: str) -> None:
    print(f"[provision] {msg}", file=sys.stderr, flush=True)


def _run(argv: list[str], *, log: Log | None = None, check: bool = True, **kw) -> subprocess.CompletedProcess:
    if log:
        log("$ " + " ".join(argv))
    kw.setdefault("text", True)
    kw.setdefault("capture_output", True)
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive", LC_ALL="C")
    env.update(kw.pop("env", {}))
    cp = subprocess.run(argv, env=env, **kw)
    if check and cp.returncode != 0:
        tail = ((cp.stderr or "") + (cp.stdout or ""))[-3000:]
        raise ProvisionError(f"command failed (rc={cp.returncode}): {' '.join(argv)}\n{tail}")
    return cp


def _hash(*parts: object) -> str:
    h = hashlib.sha256()
    for p in parts:
        h.update(json.dumps(p, sort_keys=True, default=str).encode())
        h.update(b"\0")
    return h.hexdigest()[:16]


class _Stamp:
    def __init__(self, path: Path, recipe: str) -> None:
        self.path, self.recipe = path, recipe

    def fresh(self) -> bool:
        try:
            return self.path.read_text().strip() == self.recipe
        except OSError:
            return False

    def mark(self) -> None:
        self.path.write_text(self.recipe + "\n")

    def clear(self) -> None:
        self.path.unlink(missing_ok=True)


@contextlib.contextmanager
def locked(path: Path) -> Iterator[None]:
    """An exclusive flock on path (created if needed), held for the with block."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


# ---------------------------------------------------------------- host side


def _installed(pkg: str) -> bool:
    cp = subprocess.run(["dpkg-query", "-W", "-f=${Status}", pkg], capture_output=True, text=True)
    return cp.returncode == 0 and "install ok installed" in cp.stdout


class _Apt:
    def __init__(self, log: Log) -> None:
        self.log = log
        self.updated = False

    def update(self) -> None:
        if not self.updated:
            _run(["apt-get", "update", "-qq"], log=self.log)
            self.updated = True

    def install(self, pkgs: list[str]) -> None:
        missing = [p for p in pkgs if not _installed(p)]
        if not missing:
            return
        self.update()
        _run(["apt-get", "install", "-y", "-qq", "--no-install-recommends", *missing], log=self.log)

    def has_candidate(self, pkg: str) -> bool:
        cp = _run(["apt-cache", "policy", pkg], check=False)
        m = re.search(r"Candidate:\s*(\S+)", cp.stdout or "")
        return bool(m and m.group(1) != "(none)")


def _check_machine() -> None:
    if sys.platform != "linux":
        raise ProvisionError("the qemu tier needs Linux")
    if os.geteuid() != 0:
        raise ProvisionError("the qemu tier needs root (apt-get install, debootstrap, chroot)")
    for tool in ("apt-get", "apt-cache", "dpkg-query", "dpkg-deb"):
        if not shutil.which(tool):
            raise ProvisionError(f"the qemu tier needs a Debian-family host: {tool} not found")
    if os.uname().machine != "x86_64":
        raise ProvisionError(f"the qemu tier boots an amd64 kernel; host is {os.uname().machine}")


def _installed_header_abis() -> list[str]:
    cp = subprocess.run(
        ["dpkg-query", "-W", "-f=${Package} ${Status}\n", "linux-headers-*"],
        capture_output=True,
        text=True,
    )
    abis = []
    for line in cp.stdout.splitlines():
        m = re.match(r"linux-headers-(\d+\.\d+\.\d+-\d+-amd64) install ok installed", line)
        if m:
            abis.append(m.group(1))
    return sorted(abis, key=_abi_key, reverse=True)


def _abi_key(abi: str) -> tuple:
    return tuple(int(x) if x.isdigit() else 0 for x in re.split(r"[.-]", abi))


def pick_abi(apt: _Apt, log: Log) -> str:
    env_abi = os.environ.get("NDI_VM_ABI")
    if env_abi:
        return env_abi
    for abi in _installed_header_abis():
        if (CACHE_ROOT / abi / "kernel" / "vmlinuz").exists() or apt.has_candidate(f"linux-image-{abi}"):
            return abi
        log(f"headers {abi} installed but apt cannot fetch linux-image-{abi}; skipping it")
    cp = _run(["apt-cache", "depends", "linux-headers-amd64"], check=False)
    m = re.search(r"Depends:\s*linux-headers-(\S+-amd64)", cp.stdout or "")
    if not m:
        apt.update()
        cp = _run(["apt-cache", "depends", "linux-headers-amd64"], check=False)
        m = re.search(r"Depends:\s*linux-headers-(\S+-amd64)", cp.stdout or "")
    if not m:
        raise ProvisionError(
            "cannot derive a kernel ABI: apt knows no linux-headers-amd64 "
            "(is a Debian main archive configured in apt's sources?)"
        )
    return m.group(1)


def _ensure_kernel(abi: str, kdir: Path, log: Log, deb: Path | None = None) -> list[str]:
    """kdir/vmlinuz and the modules the tier needs, from linux-image-<abi>: ``deb`` when
    given (a kernel this machine's apt does not know), else apt-get download."""
    stamp = _Stamp(kdir / ".done", _hash(RECIPE_VERSION, abi, GUEST_MODULES, BOOT_MODULES,
                                         *([deb.name, "unxz"] if deb else [])))
    order_file = kdir / "boot-modules.txt"
    if stamp.fresh():
        return order_file.read_text().split()
    log(f"unpacking linux-image-{abi}")
    if kdir.exists():
        shutil.rmtree(kdir)
    kdir.mkdir(parents=True)
    with tempfile.TemporaryDirectory(dir=kdir.parent, prefix=".kernel-") as tmp:
        t = Path(tmp)
        os.chmod(t, 0o755)
        if deb is None:
            _run(
                ["apt-get", "download", "-o", "APT::Sandbox::User=root", f"linux-image-{abi}"],
                cwd=t,
                log=log,
            )
            debs = list(t.glob("linux-image-*.deb"))
            if not debs:
                raise ProvisionError(f"apt-get download linux-image-{abi} produced no .deb")
            deb = debs[0]
        x = t / "x"
        _run(["dpkg-deb", "-x", str(deb), str(x)], log=log)
        vmlinuz = x / "boot" / f"vmlinuz-{abi}"
        mroot = x / "lib" / "modules" / abi
        if not vmlinuz.exists() or not mroot.is_dir():
            raise ProvisionError(f"linux-image-{abi} has no boot/vmlinuz-{abi} or lib/modules/{abi}")
        shutil.copy2(vmlinuz, kdir / "vmlinuz")
        shutil.copy2(x / "boot" / f"config-{abi}", kdir / "config")
        _run(["depmod", "-b", str(x), abi])

        def closure(names: list[str]) -> list[str]:
            cp = _run(["modprobe", "-d", str(x), "-S", abi, "--show-depends", "-a", *names])
            rels: list[str] = []
            for line in cp.stdout.splitlines():
                parts = line.split()
                if parts and parts[0] == "insmod":
                    rel = os.path.relpath(parts[1], mroot)
                    if rel not in rels:
                        rels.append(rel)
            return rels

        def plain(rel: str) -> str:  # newer Debian kernels ship .ko.xz; busybox insmod reads .ko
            return rel.removesuffix(".xz")

        boot = [plain(rel) for rel in closure(BOOT_MODULES)]
        every = closure(GUEST_MODULES)
        mdir = kdir / "modules"
        for rel in every:
            dst = mdir / plain(rel)
            dst.parent.mkdir(parents=True, exist_ok=True)
            if rel.endswith(".xz"):
                with open(dst, "wb") as out:
                    subprocess.run(["xz", "-dc", str(mroot / rel)], stdout=out, check=True)
            else:
                shutil.copy2(mroot / rel, dst)
        for meta in ("modules.builtin", "modules.builtin.modinfo", "modules.order"):
            if (mroot / meta).exists():
                shutil.copy2(mroot / meta, mdir / meta)
    order_file.write_text("\n".join(boot) + "\n")
    stamp.mark()
    return boot


# --------------------------------------------------------------- guest root


def _apt_entries(codename: str) -> list[dict]:
    """Enabled deb entries of this machine's apt config for <codename>*, in order."""
    entries: list[dict] = []
    files = sorted(glob.glob("/etc/apt/sources.list.d/*.sources"))
    for path in files:
        text = Path(path).read_text()
        for stanza in re.split(r"\n\s*\n", text):
            fields: dict[str, str] = {}
            key = None
            for line in stanza.splitlines():
                if line.startswith("#") or not line.strip():
                    continue
                if line[0] in " \t" and key:
                    fields[key] += " " + line.strip()
                    continue
                key, _, val = line.partition(":")
                key = key.strip().lower()
                fields[key] = val.strip()
            if fields.get("enabled", "yes").lower() == "no":
                continue
            if "deb" not in fields.get("types", "").split():
                continue
            for uri in fields.get("uris", "").split():
                for suite in fields.get("suites", "").split():
                    if suite == codename or suite.startswith(codename + "-"):
                        entries.append(
                            {
                                "uri": uri,
                                "suite": suite,
                                "components": fields.get("components", "main").split(),
                                "signed_by": fields.get("signed-by"),
                            }
                        )
    lists = ["/etc/apt/sources.list"] + sorted(glob.glob("/etc/apt/sources.list.d/*.list"))
    for path in lists:
        if not os.path.exists(path):
            continue
        for line in Path(path).read_text().splitlines():
            line = line.split("#", 1)[0].strip()
            m = re.match(r"deb\s+(?:\[([^\]]*)\]\s+)?(\S+)\s+(\S+)\s*(.*)", line)
            if not m:
                continue
            opts, uri, suite, comps = m.groups()
            if suite == codename or suite.startswith(codename + "-"):
                sb = re.search(r"signed-by=(\S+)", opts or "")
                entries.append(
                    {
                        "uri": uri,
                        "suite": suite,
                        "components": comps.split() or ["main"],
                        "signed_by": sb.group(1) if sb else None,
                    }
                )
    return entries


def _host_codename() -> str:
    text = Path("/etc/os-release").read_text()
    m = re.search(r"^VERSION_CODENAME=\"?([a-z]+)", text, re.M)
    if not m:
        raise ProvisionError("cannot read VERSION_CODENAME from /etc/os-release")
    return m.group(1)


def _python_deps() -> list[str]:
    data = tomllib.loads((REPO / "pyproject.toml").read_text())
    return list(data["project"].get("dependencies", []))


def _chroot(root: Path, script: str, log: Log) -> None:
    """Run a shell script in the chroot inside a private mount namespace."""
    wrapper = (
        "set -e; mount --make-rprivate /; "
        f"mount -t proc proc {root}/proc; mount --bind /dev {root}/dev; "
        f"mount -t sysfs sysfs {root}/sys; "
        f'chroot {root} /bin/sh -ec "$1"'
    )
    _run(
        ["unshare", "--mount", "--fork", "sh", "-c", wrapper, "sh", script],
        log=log,
        env={"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "DEBIAN_FRONTEND": "noninteractive"},
    )


def _ensure_rootfs(abi: str, cdir: Path, modules_dir: Path, log: Log) -> bool:
    """Build <cdir>/rootfs. Returns True when something changed."""
    root = cdir / "rootfs"
    codename = _host_codename()
    entries = _apt_entries(codename)
    if not entries:
        raise ProvisionError(f"no enabled apt source for {codename} in /etc/apt")
    mirror = next((e["uri"] for e in entries if e["suite"] == codename), None)
    if not mirror:
        raise ProvisionError(f"no apt source for the suite {codename} itself")
    pkgs = GUEST_PACKAGES + [f"linux-headers-{abi}"]
    changed = False

    base = _Stamp(cdir / ".rootfs-base.done", _hash(RECIPE_VERSION, codename, pkgs, entries))
    if not base.fresh():
        changed = True
        log(f"debootstrap {codename} minbase (about 30-60 s)")
        if root.exists():
            shutil.rmtree(root)
        _run(
            [
                "debootstrap",
                "--variant=minbase",
                "--include=" + ",".join(GUEST_PACKAGES[:2]),
                codename,
                str(root),
                mirror,
            ],
            log=log,
        )
        lines = []
        for e in entries:
            sb = e["signed_by"]
            opt = ""
            if sb and sb.startswith("/"):
                if not (root / sb.lstrip("/")).exists() and os.path.exists(sb):
                    (root / sb.lstrip("/")).parent.mkdir(parents=True, exist_ok=True)
                    shutil.copy2(sb, root / sb.lstrip("/"))
                opt = f"[signed-by={sb}] "
            lines.append(f"deb {opt}{e['uri']} {e['suite']} {' '.join(e['components'])}")
        (root / "etc/apt/sources.list").write_text("\n".join(lines) + "\n")
        for f in (root / "etc/apt/sources.list.d").glob("*"):
            f.unlink()
        shutil.copy2("/etc/resolv.conf", root / "etc/resolv.conf")
        _chroot(
            root,
            "apt-get update -qq && "
            f"apt-get install -y -qq --no-install-recommends {' '.join(pkgs)} && "
            "apt-get clean && rm -rf /var/lib/apt/lists/*",
            log,
        )
        (root / "etc/resolv.conf").write_text("")
        (root / "etc/hostname").write_text("ndi-vm\n")
        (root / "etc/fstab").write_text("/dev/vda / ext4 rw 0 1\n")
        if not (root / f"usr/src/linux-headers-{abi}").is_dir():
            raise ProvisionError(f"linux-headers-{abi} did not install into the guest root")
        base.mark()

    mods = _Stamp(
        cdir / ".rootfs-modules.done",
        _hash(base.recipe, (modules_dir.parent / ".done").read_text()),
    )
    if not mods.fresh():
        changed = True
        dst = root / "lib/modules" / abi
        dst.mkdir(parents=True, exist_ok=True)
        for sub in ("kernel",):
            if (dst / sub).exists():
                shutil.rmtree(dst / sub)
        shutil.copytree(modules_dir, dst, dirs_exist_ok=True)
        _run(["depmod", "-b", str(root), abi], log=log)
        mods.mark()

    deps = _python_deps()
    pydeps = _Stamp(cdir / ".rootfs-pydeps.done", _hash(base.recipe, deps, "compiled"))
    if not pydeps.fresh():
        changed = True
        target = root / "opt/ndi/deps"
        if target.exists():
            shutil.rmtree(target)
        # Wheels for the guest's interpreter (bookworm: CPython 3.11, glibc 2.36),
        # whatever interpreter runs this.
        pyver = _guest_python_version(root)
        plats = ["manylinux2014_x86_64", "linux_x86_64"] + [f"manylinux_2_{n}_x86_64" for n in range(17, 37)]
        argv = [
            sys.executable,
            "-m",
            "pip",
            "install",
            "-q",
            "--disable-pip-version-check",
            "--no-compile",
            "--only-binary=:all:",
            "--implementation",
            "cp",
            "--python-version",
            pyver,
            "--target",
            str(target),
        ]
        for p in plats:
            argv += ["--platform", p]
        _run(argv + deps, log=log)
        # Byte-compile with the guest's own python3 (an import under TCG costs ~10x).
        _run(["chroot", str(root), "python3", "-m", "compileall", "-q", "/opt/ndi/deps"], log=log)
        pydeps.mark()
    return changed


def _guest_python_version(root: Path) -> str:
    found = sorted(
        (p.name for p in (root / "usr/bin").glob("python3.*") if re.fullmatch(r"python3\.\d+", p.name)),
        key=lambda n: int(n.split(".")[1]),
    )
    if not found:
        raise ProvisionError("no python3.X in the guest root")
    return found[-1].removeprefix("python")


ROOTFS_STAMPS = (".rootfs-base.done", ".rootfs-modules.done", ".rootfs-pydeps.done")


def _ensure_image(cdir: Path, changed: bool, log: Log, stamps: tuple[str, ...] = ROOTFS_STAMPS) -> Path:
    img = cdir / "rootfs.img"
    stamp = _Stamp(
        cdir / ".image.done",
        _hash(RECIPE_VERSION, ROOTFS_IMAGE_SIZE, *[(cdir / s).read_text() for s in stamps]),
    )
    if stamp.fresh() and img.exists() and not changed:
        return img
    log("making the guest root image (mkfs.ext4 -d)")
    tmp = img.with_suffix(".tmp")
    tmp.unlink(missing_ok=True)
    _run(
        [
            "mkfs.ext4",
            "-q",
            "-F",
            "-L",
            "ndi-root",
            "-E",
            "lazy_itable_init=0,lazy_journal_init=0",
            "-d",
            str(cdir / "rootfs"),
            str(tmp),
            ROOTFS_IMAGE_SIZE,
        ],
        log=log,
    )
    os.replace(tmp, img)
    stamp.mark()
    return img


def provision(log: Log = _default_log) -> VMAssets:
    """Make sure every host tool, the kernel and the guest image are there."""
    _check_machine()
    t0 = time.monotonic()
    apt = _Apt(log)
    CACHE_ROOT.mkdir(parents=True, exist_ok=True)
    with locked(CACHE_ROOT / ".lock"):
        try:
            apt.install(HOST_PACKAGES)
        except ProvisionError:
            apt.updated = False
            apt.update()
            apt.install(HOST_PACKAGES)
        abi = pick_abi(apt, log)
        apt.install([f"linux-headers-{abi}"])
        headers = Path(f"/usr/src/linux-headers-{abi}")
        if not headers.is_dir():
            raise ProvisionError(f"linux-headers-{abi} installed but {headers} is missing")
        cdir = CACHE_ROOT / abi
        kdir = cdir / "kernel"
        boot = _ensure_kernel(abi, kdir, log)
        changed = _ensure_rootfs(abi, cdir, kdir / "modules", log)
        img = _ensure_image(cdir, changed, log)
    log(f"ready: {abi} in {time.monotonic() - t0:.1f} s")
    return VMAssets(
        abi=abi,
        cache_dir=cdir,
        vmlinuz=kdir / "vmlinuz",
        modules_dir=kdir / "modules",
        boot_modules=boot,
        rootfs_image=img,
        headers_dir=headers,
        guest_python=_guest_python_version(cdir / "rootfs"),
    )


def provision_extra_kernel(abi: str, image_deb: Path, headers_dir: Path, base: VMAssets,
                           log: Log = _default_log) -> VMAssets:
    """A second kernel under the base guest's userland (e.g. Debian's 6.12 from
    tests/realparts/newer_kernel.py): ``<cache>/<abi>/kernel`` from ``image_deb`` and a
    root image of the base root tree (hard links, never written) plus /lib/modules/<abi>.
    ``headers_dir``: its output headers dir, for the host builds of test modules."""
    cdir = CACHE_ROOT / abi
    with locked(CACHE_ROOT / ".lock"):
        kdir = cdir / "kernel"
        boot = _ensure_kernel(abi, kdir, log, deb=image_deb)
        root = cdir / "rootfs"
        tree = _Stamp(cdir / ".rootfs-tree.done",
                      _hash(RECIPE_VERSION, *[(base.cache_dir / s).read_text() for s in ROOTFS_STAMPS],
                            (kdir / ".done").read_text()))
        changed = not tree.fresh()
        if changed:
            log(f"guest root for {abi}: the {base.abi} root tree + its modules")
            shutil.rmtree(root, ignore_errors=True)
            _run(["cp", "-al", str(base.cache_dir / "rootfs"), str(root)], log=log)
            # New files only: the hard-linked base files are never opened for writing.
            shutil.copytree(kdir / "modules", root / "lib/modules" / abi)
            _run(["depmod", "-b", str(root), abi], log=log)
            tree.mark()
        img = _ensure_image(cdir, changed, log, stamps=(".rootfs-tree.done",))
    return dataclasses.replace(base, abi=abi, cache_dir=cdir, vmlinuz=kdir / "vmlinuz",
                               modules_dir=kdir / "modules", boot_modules=boot,
                               rootfs_image=img, headers_dir=headers_dir)


if __name__ == "__main__":
    assets = provision()
    print(json.dumps(assets.to_json(), indent=2))
