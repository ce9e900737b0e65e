"""What the guest runs in each boot of the qemu tier (see conftest.py).

Every install is the real CLI on the guest's own root (``--host-root /``),
the way it is run by hand on a node; the driver comes from a ``file://`` URL.
"""

from __future__ import annotations

from tests.vm.driver_run import run_name
from tests.vm.harness import Step

VERSIONS = {
    "a": "550.54.14",  # first install: compiled in the guest
    "b": "550.90.07",  # replaces a while a is loaded and unused
    "c": "560.35.03",  # refused while b is in use
    "d": "535.183.01",  # modules built for another kernel release
    "e": "545.23.08",  # nvidia-uvm needs a symbol its nvidia.ko lacks
}
PARAM = "from-qemu-test"
INSTALL_DIR = "/home/kubernetes/bin/nvidia"
DRIVERS = f"{INSTALL_DIR}/drivers"
# --display-modules: the VM tier proves all four NVIDIA modules load in dependency order in
# a real kernel (modeset and drm included: their in-tree deps, drm's unknown-symbol
# refusal); a node gets nvidia and nvidia-uvm only by default (modules.COMPUTE_MODULES).
# --skip-cuda-check: a VM has no GPU for CUDA to find; the check itself is proven against the
# fake libcuda (tests/integration/test_cuda_check.py) and on a real GPU (tests/gpu).
INSTALL = ("nvidia-driver-installer install --host-root / --log-format json --display-modules "
           "--skip-cuda-check")
PROBE = "python3 /ndi/probe.py"
INSTALL_TIMEOUT = 900


def install(key: str, *, url: str | None = None) -> str:
    version = VERSIONS[key]
    url = url or f"file:///ndi/files/{run_name(version)}"
    return f"{INSTALL} --driver-version {version} --driver-url {url} --module-arg nvidia.NVreg_Test={PARAM}"


def missing_url(key: str) -> str:
    """A URL that cannot be fetched: a cache hit must not need it."""
    return f"file:///nonexistent/{run_name(VERSIONS[key])}"


def install_steps() -> list[Step]:
    return [
        Step("detect", "nvidia-driver-installer detect -o json --host-root /"),
        Step("install-a", install("a"), timeout=INSTALL_TIMEOUT),
        Step("probe-a", PROBE),
        Step("installer-log-a", f"cat {INSTALL_DIR}/nvidia-installer.log"),
        Step("kernel-build-log-a", f"cat {INSTALL_DIR}/kernel-build.log"),
        Step("install-a-again", install("a"), timeout=INSTALL_TIMEOUT),
        Step("probe-a-again", PROBE),
        Step("install-b", install("b"), timeout=INSTALL_TIMEOUT),
        Step("probe-b", PROBE),
        # In use by a module that links against nvidia.ko.
        Step("hold-module", "insmod /ndi/files/nvidia_holder.ko && cat /proc/modules"),
        Step("install-c-held", install("c"), timeout=INSTALL_TIMEOUT),
        Step("probe-held", PROBE),
        Step("release-module", "rmmod nvidia_holder"),
        # In use by a process with /dev/nvidia0 open.
        Step(
            "hold-handle",
            "setsid sleep 900 < /dev/nvidia0 > /dev/null 2>&1 & sleep 1; grep '^nvidia ' /proc/modules",
        ),
        Step("install-c-handle", install("c"), timeout=INSTALL_TIMEOUT),
        Step("probe-handle", PROBE),
        Step("release-handle", "pkill -x sleep; sleep 1; grep '^nvidia ' /proc/modules"),
    ]


def reboot_steps() -> list[Step]:
    return [
        Step("probe-reboot", PROBE),
        # The kernel itself refuses modules loaded before what they link against.
        Step("wrong-order-uvm", f"insmod {DRIVERS}/nvidia-uvm.ko"),
        Step("wrong-order-drm", f"modprobe drm && insmod {DRIVERS}/nvidia-drm.ko"),
        Step("install-b-cached", install("b", url=missing_url("b")), timeout=INSTALL_TIMEOUT),
        Step("probe-b-cached", PROBE),
        Step("install-d-other-kernel", install("d"), timeout=INSTALL_TIMEOUT),
        Step("probe-d", PROBE),
        Step("kernel-rejects-other-kernel", "insmod /ndi/files/other-kernel/nvidia.ko"),
        Step("install-e-unknown-symbol", install("e"), timeout=INSTALL_TIMEOUT),
        Step("probe-e", PROBE),
        Step("install-b-recover", install("b", url=missing_url("b")), timeout=INSTALL_TIMEOUT),
        Step("probe-recover", PROBE),
    ]


SIG_ENFORCE_PARAM = "/sys/module/module/parameters/sig_enforce"


def enforce_steps() -> list[Step]:
    """Signature enforcement switched on for the rest of this boot. The kernel lets root turn
    it on at run time and never off again: kernel/module/signing.c ``module_param(sig_enforce,
    bool_enable_only, 0644)``, kernel/params.c ``param_set_bool_enable_only`` (-EROFS on an
    unset). The enforced steps so run last in a boot instead of costing a boot of their own
    (module.sig_enforce=1 on the command line sets the same variable at boot)."""
    # os.write: the kernel's error raises at once (a buffered file's would be lost at exit).
    undo = f"import os; os.write(os.open('{SIG_ENFORCE_PARAM}', os.O_WRONLY), b'0')"
    return [
        Step("enforce", f"echo 1 > {SIG_ENFORCE_PARAM} && cat {SIG_ENFORCE_PARAM}"),
        Step("enforce-undo-refused", f'python3 -c "{undo}"; rc=$?; cat {SIG_ENFORCE_PARAM}; exit $rc'),
    ]


def sig_enforce_steps() -> list[Step]:
    """The last steps of the reboot: b unloaded (as after a reboot), enforcement on, then our
    unsigned modules cannot load."""
    return [
        Step("unload-b", "rmmod nvidia_drm nvidia_modeset nvidia_uvm nvidia && "
             "rm -f /dev/nvidia* && cat /proc/modules"),
        *enforce_steps(),
        # Cached b: nothing to build, the kernel itself refuses the load.
        Step("install-b-enforced", install("b", url=missing_url("b")), timeout=INSTALL_TIMEOUT),
        # A version not cached: refused before anything is downloaded or built.
        Step("install-a-enforced", install("a", url=missing_url("a")), timeout=INSTALL_TIMEOUT),
        Step("probe-enforced", PROBE),
    ]


# ----------------------------------------------------- NVIDIA's real modules

DATA = "/mnt/data"  # the data disk: real installs built on the host, ndi_fwreq.ko
# data-disk dir -> (driver version key, --kernel-module-type). 535.261.03's open modules
# do not compile against this kernel (tests/realparts: pci_resize_resource), so there is
# no open install to load.
REAL_FLAVORS = {
    "install-535": ("main", "proprietary"),
    "install-470": ("legacy", "proprietary"),
}


def real_install(version: str, module_type: str) -> str:
    """A cache-hit run: the install was built on the host; the URL cannot be fetched."""
    url = f"file:///nonexistent/{run_name(version)}"
    return (f"{INSTALL} --driver-version {version} --driver-url {url} "
            f"--kernel-module-type {module_type}")


def place(install: str) -> str:
    return (f"rm -rf {INSTALL_DIR} && mkdir -p {INSTALL_DIR.rsplit('/', 1)[0]} && "
            f"cp -a {DATA}/{install} {INSTALL_DIR} && ls {INSTALL_DIR}/drivers")


def fw_request(name: str) -> str:
    """insmod succeeds only if the kernel's firmware loader finds ``name``."""
    return f"insmod {DATA}/ndi_fwreq.ko name={name} && rmmod ndi_fwreq"


def real_parts_steps(versions: dict[str, str]) -> list[Step]:
    gsp = f"nvidia/{versions['main']}/gsp_ga10x.bin"
    steps = [
        Step("mount-data", f"mkdir -p {DATA} && mount -o ro /dev/vdb {DATA} && ls {DATA}"),
        Step("firmware-before", fw_request(gsp)),
    ]
    for install, (key, module_type) in REAL_FLAVORS.items():
        steps += [
            Step(f"place-{install}", place(install)),
            Step(f"run-{install}", real_install(versions[key], module_type),
                 timeout=INSTALL_TIMEOUT),
            Step(f"modules-after-{install}", "cat /proc/modules"),
        ]
        if install == "install-535":
            steps += [
                Step("firmware-path", "cat /sys/module/firmware_class/parameters/path"),
                Step("firmware-after", fw_request(gsp)),
            ]
    return steps


def real_sig_enforce_steps(versions: dict[str, str]) -> list[Step]:
    """The real node's last steps (the data disk is mounted): enforcement on, the real 535
    install refused by the kernel."""
    return [
        *enforce_steps(),
        Step("place-install-535-enforced", place("install-535")),
        Step("run-install-535-enforced", real_install(versions["main"], "proprietary"),
             timeout=INSTALL_TIMEOUT),
        Step("modules-after-enforced", "cat /proc/modules"),
    ]


# ------------------------------------------------- bundles of NVIDIA's real modules

BUNDLE_SET = "bundle-set"  # the data disk's dir of bundles (tests/vm/bundles.py)
BUNDLES = f"{DATA}/{BUNDLE_SET}"
BUNDLE_FLAVOR = "install-535"


def bundle_install(version: str, url: str, *extra: str) -> str:
    """A fresh node with --prebuilt-only: a bundle or nothing (the .run URL is never read)."""
    return (f"{INSTALL} --driver-version {version} --driver-url file:///nonexistent/"
            f"{run_name(version)} --kernel-module-type proprietary --prebuilt-url {url} "
            f"--prebuilt-only {' '.join(extra)}").rstrip()


def bundle_steps(made) -> list[Step]:  # made: tests.vm.bundles.Bundles
    version = made.key.driver_version
    fresh = f"rm -rf {INSTALL_DIR} && cat /proc/modules"
    installs = [
        ("bundle-missing", bundle_install(version, f"file://{BUNDLES}/none/")),
        ("bundle-tampered", bundle_install(version, f"file://{BUNDLES}/tampered/")),
        ("bundle-other-kernel", bundle_install(
            version, f"file://{BUNDLES}/other-kernel/{made.other_name}",
            f"--prebuilt-sha256 {made.other_sha256}")),
        ("bundle-install", bundle_install(version, f"file://{BUNDLES}/bundles/")),
    ]
    steps = [Step("list-bundles", f"ls -R {BUNDLES}"), Step("fresh-node", fresh)]
    for name, sh in installs:
        # What is installed and loaded after each run: nothing is promoted without a GPU.
        steps += [Step(name, sh, timeout=INSTALL_TIMEOUT),
                  Step(f"after-{name}", f"ls {DRIVERS} 2>&1; cat /proc/modules")]
    return steps


# ------------------------------------- R550 and the open modules in Debian's 6.12 kernel

# data-disk dir -> --kernel-module-type: NVIDIA's real 550.163.01 built on the host through
# the installer against 6.12's headers (550 has no --kernel-module-type: the installer
# runs NVIDIA's Makefile in kernel-open/ or kernel/ itself).
R550_FLAVORS = {
    "install-550-open": "open",
    "install-550-proprietary": "proprietary",
}
REAL_SMI = f"{DATA}/real-smi"  # NVIDIA's nvidia-smi and libnvidia-ml 550 (Debian's packages)
GSP_FILES = ("gsp_ga10x.bin", "gsp_tu10x.bin")
R550_BUNDLES = f"{DATA}/bundles"


def modinfo() -> str:
    """What the kernel will check of each built module (printed in the tier's log)."""
    return (f"modinfo {DRIVERS}/*.ko | "
            "grep -E '^(filename|version|license|vermagic|firmware|depends):'")


def firmware_steps(version: str, when: str) -> list[Step]:
    return [Step(f"firmware-{when}-{name.split('.')[0]}", fw_request(f"nvidia/{version}/{name}"))
            for name in GSP_FILES]


def real_smi() -> str:
    """NVIDIA's own nvidia-smi and NVML, after nvidia.ko's init failed."""
    return f"LD_LIBRARY_PATH={REAL_SMI} {REAL_SMI}/nvidia-smi"


def classify_real_smi() -> str:
    """The installer's verify.smi_failure_hint on the real nvidia-smi's words, in the guest."""
    return (f"{real_smi()} > /tmp/smi.out 2>&1; echo \"rc=$?\"; cat /tmp/smi.out; "
            "python3 -c 'import sys; from installer.services.verify import smi_failure_hint; "
            "print(\"hint: \" + smi_failure_hint(open(\"/tmp/smi.out\").read()))'")


def verify_with_real_smi(version: str, install: str) -> str:
    """``verify`` with NVIDIA's own nvidia-smi and NVML in the install dir. The real
    nvidia-smi, run as root before this, made /dev/nvidiactl itself (NVML creates the
    control node when it is missing, driver or not); /dev/nvidia0, /dev/nvidia-uvm and
    /dev/nvidia-uvm-tools are added as stale nodes (what verify requires besides the control
    node: devnodes.missing_nodes), so the installer gets past its device check, runs the
    real binary and classifies its words. The install dir and /dev are put back afterwards."""
    lib = f"libnvidia-ml.so.{version}"
    return (f"cp {REAL_SMI}/nvidia-smi {INSTALL_DIR}/bin/nvidia-smi && "
            f"cp {REAL_SMI}/{lib} {INSTALL_DIR}/lib64/{lib} && "
            "{ [ -e /dev/nvidia0 ] || mknod /dev/nvidia0 c 195 0; } && "
            "{ [ -e /dev/nvidia-uvm ] || mknod /dev/nvidia-uvm c 235 0; } && "
            "{ [ -e /dev/nvidia-uvm-tools ] || mknod /dev/nvidia-uvm-tools c 235 1; } && "
            "nvidia-driver-installer verify --host-root / --log-format json; rc=$?; "
            f"cp -a {DATA}/{install}/bin/nvidia-smi {INSTALL_DIR}/bin/nvidia-smi; "
            f"cp -a {DATA}/{install}/lib64/{lib} {INSTALL_DIR}/lib64/{lib}; "
            "rm -f /dev/nvidiactl /dev/nvidia0 /dev/nvidia-uvm /dev/nvidia-uvm-tools; exit $rc")


def r550_steps(version: str) -> list[Step]:
    steps = [
        Step("mount-data", f"mkdir -p {DATA} && mount -o ro /dev/vdb {DATA} && ls {DATA}"),
        Step("uname", "uname -r"),
        # Where the in-tree modules NVIDIA's declare come from: the guest's own tree.
        Step("in-tree-deps", "modprobe -a --show-depends drm drm_kms_helper drm_ttm_helper video"),
        *firmware_steps(version, "before"),
    ]
    for install, module_type in R550_FLAVORS.items():
        steps += [
            Step(f"place-{install}", place(install)),
            Step(f"modinfo-{install}", modinfo()),
            Step(f"run-{install}", real_install(version, module_type), timeout=INSTALL_TIMEOUT),
            Step(f"modules-after-{install}", "cat /proc/modules"),
        ]
        if module_type == "open":
            steps += [Step("firmware-path", "cat /sys/module/firmware_class/parameters/path"),
                      *firmware_steps(version, "after")]
    last = list(R550_FLAVORS)[-1]
    return steps + [Step("dev-before-real-smi", "ls -l /dev/ | grep nvidia; true"),
                    Step("real-smi", real_smi()),
                    Step("dev-after-real-smi", "ls -l /dev/ | grep nvidia; true"),
                    Step("real-smi-classified", classify_real_smi()),
                    Step("verify-real-smi", verify_with_real_smi(version, last))]


def r550_bundle_install(version: str, module_type: str) -> str:
    return (f"{INSTALL} --driver-version {version} --driver-url file:///nonexistent/"
            f"{run_name(version)} --kernel-module-type {module_type} "
            f"--prebuilt-url file://{R550_BUNDLES}/ --prebuilt-only")


def r550_reboot_steps(version: str) -> list[Step]:
    """The same disk after a reboot (firmware_class.path is per boot), then fresh installs
    from the open bundle: keyed by module type, so asking for proprietary finds none."""
    last = list(R550_FLAVORS)[-1]
    return [
        Step("mount-data", f"mkdir -p {DATA} && mount -o ro /dev/vdb {DATA}"),
        *firmware_steps(version, "rebooted"),
        Step(f"rerun-{last}", real_install(version, R550_FLAVORS[last]), timeout=INSTALL_TIMEOUT),
        *firmware_steps(version, "from-cache"),
        Step("fresh-node", f"rm -rf {INSTALL_DIR} && cat /proc/modules"),
        Step("bundle-550-proprietary", r550_bundle_install(version, "proprietary"),
             timeout=INSTALL_TIMEOUT),
        Step("bundle-550-open", r550_bundle_install(version, "open"), timeout=INSTALL_TIMEOUT),
        Step("after-bundle-550-open", f"ls {DRIVERS} 2>&1; cat /proc/modules"),
    ]
