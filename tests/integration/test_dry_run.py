"""`install --dry-run` refuses what the real run refuses (issue 14): it runs the plan's
pre-flight checks (the steps marked ``check``), with the real run's exit code and final
line, and prints a plan only when those pass. Each case runs both, as the pod does."""

from __future__ import annotations

import json

import pytest

from tests.fixtures.kernel import UBUNTU_KERNEL as RELEASE
from tests.integration.conftest import V1, V2
from tests.pod import last_event, ok

pytestmark = pytest.mark.chroot

L4_TOO_OLD = (
    "FAILED in step check_gpu_compatibility (usage, exit 2): driver 470.256.02 (R470) is too "
    "old for NVIDIA L4 at 0000:00:04.0: it needs R525 or newer. What to do: the GPUs on this "
    "node support R525 or newer: set --driver-version (NVIDIA_DRIVER_VERSION) to such a "
    "driver, e.g. 580.82.07, or leave it unset to get a supported default.")
K80_TOO_NEW = (
    "FAILED in step check_gpu_compatibility (usage, exit 2): driver 550.54.14 (R550) is too "
    "new for Tesla K80 at 0000:00:04.0: Kepler GPUs need R470 or older. What to do: the GPUs "
    "on this node support R340 to R470: set --driver-version (NVIDIA_DRIVER_VERSION) to such a "
    "driver, e.g. 470.256.02, or leave it unset to get a supported default.")
ARCH = ("FAILED (unsupported_host, exit 3): unsupported host OS 'arch' (Arch Linux). What to do: "
        "supported: Container-Optimized OS (ID=cos), Ubuntu (ID=ubuntu), Debian (ID=debian).")
BAD_FLAG = (
    "FAILED (usage, exit 2): --kernel-release '5.15/../../etc' is not a kernel release. What to "
    "do: give the node's `uname -r`, e.g. 5.15.0-1049-gke (letters, digits and . - _ + ~, at "
    "most 64 characters).")


def bad_running_kernel(kernel) -> str:
    return ("FAILED (unsupported_host, exit 3): the running kernel's release 'weird kernel!' "
            "(uname -r) is not a kernel release: it names the headers, modules and cache to "
            "use. What to do: pass the node's real release with --kernel-release "
            f"(KERNEL_RELEASE), or check {kernel.proc_dir}/sys/kernel/osrelease.")


def refused(proc, code: int) -> str:
    """A refusal: the exit code, no traceback, no plan; the final line."""
    assert proc.returncode == code, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr
    assert proc.stdout == ""
    final = last_event(proc)
    assert final["event"] == "install_failed" and "\n" not in final["message"]
    return final["message"]


@pytest.mark.parametrize("case", ["470-on-l4", "550-on-k80", "unknown-distro",
                                  "bad-kernel-release-flag", "bad-running-kernel-release"])
def test_dry_run_refuses_what_the_real_run_refuses(node, pod, kernel, server, case):
    env, args = {}, []
    if case == "470-on-l4":
        env["NVIDIA_DRIVER_VERSION"], code, message = "470.256.02", 2, L4_TOO_OLD
    elif case == "550-on-k80":
        (kernel.sys_dir / "bus/pci/devices/0000:00:04.0/device").write_text("0x102d\n")
        code, message = 2, K80_TOO_NEW
    elif case == "unknown-distro":
        (node.root / "etc/os-release").write_text('ID=arch\nPRETTY_NAME="Arch Linux"\n')
        code, message = 3, ARCH
    elif case == "bad-kernel-release-flag":
        args, code, message = ["--kernel-release", "5.15/../../etc"], 2, BAD_FLAG
    else:
        (kernel.proc_dir / "sys/kernel/osrelease").write_text("weird kernel!\n")
        code, message = 3, bad_running_kernel(kernel)
    assert refused(pod.run("install", "--dry-run", *args, env=env), code) == message
    assert refused(pod.run("install", *args, env=env), code) == message
    assert server.requests == []  # both refused before any download


def test_dry_run_refuses_a_replacement_while_the_driver_is_in_use(node, pod, kernel, server):
    ok(pod.run("install"))
    kernel.hold("nvidia")
    dry = refused(pod.run("install", "--dry-run", env={"NVIDIA_DRIVER_VERSION": V2}), 8)
    assert dry.startswith("FAILED in step check_loaded_driver (module_load, exit 8): ")
    assert dry == refused(pod.run("install", env={"NVIDIA_DRIVER_VERSION": V2}), 8)


def test_dry_run_with_no_gpu_prints_the_plan_and_the_load_failure_it_leads_to(node, pod, kernel,
                                                                              server):
    """The real run builds, then fails: exit 8 (nvidia.ko's init finds no GPU, ENODEV,
    docs/contract.md §3). The dry run says so and still prints the plan (issue 41: on a
    workstation or in CI it stopped at exit 8, so no plan could be previewed)."""
    import shutil

    shutil.rmtree(kernel.sys_dir / "bus/pci/devices/0000:00:04.0")
    text = ok(pod.run("install", "--dry-run")).stdout.splitlines()
    assert text[0] == (f"dry run: fresh plan for Ubuntu 22.04.4 LTS, kernel {RELEASE}; pre-flight "
                       "checks passed but NO NVIDIA GPU was found (no_gpu below), nothing was "
                       "changed")
    assert (f"no_gpu: no NVIDIA GPU on the PCI bus ({kernel.sys_dir}/bus/pci/devices): here the "
            "real run would build the driver, then fail to load it (exit 8, nvidia.ko: NVRM: No "
            "NVIDIA GPU found.); the plan is the one a node with a GPU gets") in text
    assert "steps:" in text and any(". load_modules" in line for line in text), text
    plan = json.loads(ok(pod.run("install", "--dry-run", "-o", "json")).stdout)
    assert plan["no_gpu"].startswith("no NVIDIA GPU on the PCI bus") and plan["steps"]
    assert server.requests == [] and kernel.calls() == []
    real = pod.run("install")
    assert real.returncode == 8, real.stderr[-3000:]
    final = last_event(real)
    assert final["error_class"] == "module_load", final
    # The fake node's kernel log, never the machine's (issue 43): its last NVRM record is
    # the driver's own "No NVIDIA GPU found." (fakekmod, as nv.c prints it).
    assert "(kernel: NVRM: No NVIDIA GPU found.)" in final["error"], final
    assert final["kernel_log"] == final["kernel_log_tail"] == [
        "[    0.000000] NVRM: No NVIDIA GPU found."], final


def test_dry_run_refuses_an_install_dir_host_that_is_not_the_install_dir(node, pod, server):
    """The real run refuses it under the lock (exit 2, issue 33 item 8); the dry run, which
    takes no lock, planned it anyway (issue 41)."""
    args = ("--install-dir-host", "/etc")
    message = refused(pod.run("install", "--dry-run", *args), 2)
    assert message.startswith("FAILED (usage, exit 2): --install-dir-host /etc is not the "
                              "directory mounted at --install-dir"), message
    assert refused(pod.run("install", *args), 2) == message
    assert server.requests == []


def test_install_only_dry_run_with_no_gpu_only_warns_as_its_real_run(node, pod, kernel, server):
    """--install-only loads nothing, so a GPU-less node is only warned about (README,
    cos-gpu-installer v2's -no-verify): the dry run agrees with the real run (issue 34 §2)."""
    import shutil

    shutil.rmtree(kernel.sys_dir / "bus/pci/devices/0000:00:04.0")
    for args in (("--dry-run",), ()):
        proc = ok(pod.run("install", "--install-only", *args))
        assert '"no_gpu_found"' in proc.stderr


def test_dry_run_shows_module_args_and_its_checks(node, pod, kernel, server):
    env = {"NVIDIA_MODULE_ARGS": "nvidia.NVreg_EnableGpuFirmware=0 nvidia-uvm.uvm_perf_prefetch_enable=0"}
    proc = ok(pod.run("install", "--dry-run", "--module-arg", "nvidia.NVreg_DeviceFileMode=0666",
                      "-o", "json", env=env))
    plan = json.loads(proc.stdout)
    assert plan["module_args"] == {"nvidia": ["NVreg_DeviceFileMode=0666"]}  # a flag wins
    proc = ok(pod.run("install", "--dry-run", "-o", "json", env=env))
    plan = json.loads(proc.stdout)
    assert plan["module_args"] == {"nvidia": ["NVreg_EnableGpuFirmware=0"],
                                   "nvidia_uvm": ["uvm_perf_prefetch_enable=0"]}
    assert [s["name"] for s in plan["steps"] if s["check"]] == [
        "check_gpu_compatibility", "check_module_loading", "check_module_signing",
        "check_loaded_driver"]
    text = ok(pod.run("install", "--dry-run", env=env)).stdout.splitlines()
    assert text[0] == (f"dry run: fresh plan for Ubuntu 22.04.4 LTS, kernel {RELEASE}; "
                       "pre-flight checks passed, nothing was changed")
    at = text.index("module_args:")
    assert text[at:at + 5] == ["module_args:", "  nvidia:", "    - NVreg_EnableGpuFirmware=0",
                               "  nvidia_uvm:", "    - uvm_perf_prefetch_enable=0"]
    assert ("   1. check_gpu_compatibility: NVIDIA GPUs in sysfs support driver "
            f"{V1}; auto kernel modules [checked: passed]") in text
    assert server.requests == [] and kernel.calls() == []


def _no_gpu_node(kernel) -> None:
    import shutil

    shutil.rmtree(kernel.sys_dir / "bus/pci/devices/0000:00:04.0")


def _assumed_dry_run(pod, node, kernel, *args, env=None):
    """``install --dry-run *args``, its JSON plan or refusal, and the host tree unchanged."""
    from tests.integration.test_operator import tree_state

    before = tree_state(node.root, kernel.dev_dir)
    proc = pod.run("install", "--dry-run", *args, env=env)
    assert tree_state(node.root, kernel.dev_dir) == before
    assert kernel.calls() == []
    return proc


@pytest.mark.parametrize("model, version, device_id, module_type", [
    # Turing takes either: NVIDIA's default for the branch (proprietary before R560, open after)
    ("T4", V1, "0x1eb8", "proprietary"),
    ("t4", "580.82.07", "0x1eb8", "open"),
    ("h100", "580.82.07", "0x2330", "open"),
    ("0x2330", "580.82.07", "0x2330", "open"),
    ("Tesla P4", "580.82.07", "0x1bb3", "proprietary"),  # Pascal: open needs Turing+
    ("B200", "570.133.20", "0x2901", "open"),  # Blackwell: open required on every branch
    ("A100", V1, "0x20b0", "proprietary"),  # a name, not hex: the A100-SXM4-40GB
])
def test_dry_run_gpu_model_plans_for_the_named_gpu(node, pod, kernel, server, model, version,
                                                   device_id, module_type):
    """Issue 41: a workstation or CI previews the plan a node with that GPU gets; the module
    flavour follows the table (gpus.MODELS) as it does for a GPU found on the bus."""
    from installer.host import gpus

    _no_gpu_node(kernel)
    proc = ok(_assumed_dry_run(pod, node, kernel, "--gpu-model", model, "-o", "json",
                               env={"NVIDIA_DRIVER_VERSION": version}))
    plan = json.loads(proc.stdout)
    assumed = gpus.assumed_gpu(model)
    assert gpus.choose_module_type([assumed], version).module_type == module_type
    assert plan["assumed_gpu"]["device_id"] == device_id
    assert plan["assumed_gpu"]["name"] == gpus.MODELS[device_id].name
    assert plan["kernel_module_type"] == module_type, plan
    assert "no_gpu" not in plan
    text = ok(_assumed_dry_run(pod, node, kernel, env={"NVIDIA_DRY_RUN_GPU_MODEL": model,
                                                       "NVIDIA_DRIVER_VERSION": version})
              ).stdout.splitlines()
    assert text[0] == (f"ASSUMED GPU: {gpus.MODELS[device_id].name} ({device_id}, --gpu-model "
                       f"{model}): this node has no NVIDIA GPU; the plan is for one with that "
                       "GPU on its PCI bus (the NVLink fabric is still this node's)")
    assert text[1].startswith("dry run: fresh plan for Ubuntu 22.04.4 LTS") and "NO NVIDIA" not in text[1]
    assert server.requests == []


def test_dry_run_gpu_model_refuses_a_branch_too_old_for_it_as_the_real_run(node, pod, kernel,
                                                                          server):
    """B200/GB200 need R570: R535 is refused with the real run's exit code and check."""
    _no_gpu_node(kernel)
    for model, name in (("B200", "NVIDIA B200"), ("gb200", "NVIDIA GB200")):
        proc = _assumed_dry_run(pod, node, kernel, "--gpu-model", model,
                                env={"NVIDIA_DRIVER_VERSION": "535.230.02"})
        assert refused(proc, 2) == (
            "FAILED in step check_gpu_compatibility (usage, exit 2): driver 535.230.02 (R535) "
            f"is too old for {name} at (--gpu-model): it needs R570 or newer. What to do: the "
            "GPUs on this node support R570 or newer: set --driver-version "
            "(NVIDIA_DRIVER_VERSION) to such a driver, e.g. 580.82.07, or leave it unset to "
            "get a supported default.")
    kepler = refused(_assumed_dry_run(pod, node, kernel, "--gpu-model", "K80",
                                      env={"NVIDIA_DRIVER_VERSION": V1}), 2)
    assert kepler == K80_TOO_NEW.replace("0000:00:04.0", "(--gpu-model)"), kepler
    # The real run on a node with a B200 on its bus refuses it with the same check.
    (kernel.sys_dir / "bus/pci/devices/0000:00:04.0").mkdir(parents=True)
    for attr, value in (("vendor", "0x10de"), ("device", "0x2901"), ("class", "0x030200")):
        (kernel.sys_dir / "bus/pci/devices/0000:00:04.0" / attr).write_text(value + "\n")
    real = refused(pod.run("install", env={"NVIDIA_DRIVER_VERSION": "535.230.02"}), 2)
    assert real.startswith("FAILED in step check_gpu_compatibility (usage, exit 2): driver "
                           "535.230.02 (R535) is too old for NVIDIA B200 at 0000:00:04.0: it "
                           "needs R570 or newer."), real
    assert server.requests == []


def test_dry_run_gpu_model_refuses_an_unknown_model_a_real_run_and_a_mix(node, pod, kernel,
                                                                        server):
    proc = _assumed_dry_run(pod, node, kernel, "--gpu-model", "H900")  # a GPU here: name first
    message = refused(proc, 2)
    assert message.startswith("FAILED (usage, exit 2): --gpu-model 'H900' is not a GPU model "
                              "this installer knows. What to do: use one of K80, "), message
    assert "H100, " in message and "a PCI device id such as 0x2330" in message
    real = pod.run("install", "--gpu-model", "H100")
    assert refused(real, 2).startswith("FAILED (usage, exit 2): --gpu-model "
                                       "(NVIDIA_DRY_RUN_GPU_MODEL) previews only: it needs "
                                       "--dry-run.")
    # The fixture node has an L4: naming another model would mix them.
    mixed = refused(_assumed_dry_run(pod, node, kernel, "--gpu-model", "H100"), 2)
    assert mixed.startswith("FAILED (usage, exit 2): --gpu-model 'H100' names NVIDIA H100 80GB "
                            "HBM3, and this node has NVIDIA L4 at 0000:00:04.0"), mixed
    # Naming its own model assumes nothing: the node's plan.
    plan = json.loads(ok(_assumed_dry_run(pod, node, kernel, "--gpu-model", "L4", "-o",
                                          "json")).stdout)
    assert "assumed_gpu" not in plan
    assert server.requests == []


def test_dry_run_gpu_model_grace_part_gets_its_cdmm_default(node, pod, kernel, server):
    """A Grace part (GB200) gets NVreg_CoherentGPUMemoryMode=driver as on its own node
    (detect.with_grace_defaults); a B200, no Grace part, does not."""
    _no_gpu_node(kernel)
    env = {"NVIDIA_DRIVER_VERSION": "580.82.07"}  # the option exists from 580.65.06
    grace = json.loads(ok(_assumed_dry_run(pod, node, kernel, "--gpu-model", "GB200", "-o",
                                           "json", env=env)).stdout)
    assert grace["module_args"] == {"nvidia": ["NVreg_CoherentGPUMemoryMode=driver"]}
    assert grace["kernel_module_type"] == "open"
    plain = json.loads(ok(_assumed_dry_run(pod, node, kernel, "--gpu-model", "B200", "-o",
                                           "json", env=env)).stdout)
    assert plain["module_args"] == {}
