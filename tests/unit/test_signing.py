import pytest

from installer.kmod import signing
from installer.kmod.kernel import KernelState
from installer.kmod.signing import KernelSigning, decide


@pytest.mark.parametrize(("state", "reasons"), [
    (KernelSigning(), ()),
    (KernelSigning(sig_enforce_param="N", lockdown="none", secure_boot=False), ()),
    (KernelSigning(cmdline="ro module.sig_enforce=1"),
     ("module.sig_enforce=1 is on the kernel command line",)),
    (KernelSigning(cmdline="module.sig_enforce=0", sig_enforce_param="N"), ()),
    (KernelSigning(sig_enforce_param="Y"),
     ("module.sig_enforce is on (module/module/parameters/sig_enforce is Y)",)),
    # the command line names the cause: the parameter it sets is not repeated
    (KernelSigning(cmdline="module.sig_enforce=y", sig_enforce_param="Y"),
     ("module.sig_enforce=1 is on the kernel command line",)),
    (KernelSigning(lockdown="integrity"), ("kernel lockdown=integrity",)),
    (KernelSigning(lockdown="confidentiality", sig_enforce_param="Y"),
     ("module.sig_enforce is on (module/module/parameters/sig_enforce is Y)",
      "kernel lockdown=confidentiality")),
    # Secure Boot explains an enforcement; by itself the kernel still loads unsigned modules
    (KernelSigning(lockdown="integrity", secure_boot=True),
     ("Secure Boot is on", "kernel lockdown=integrity")),
    (KernelSigning(secure_boot=True), ()),
])
def test_unsigned_modules_refused_and_why(state, reasons):
    policy = decide(state)
    assert policy.reasons == reasons
    assert policy.enforced is bool(reasons)
    assert policy.why() == "; ".join(reasons)


@pytest.mark.parametrize(("cmdline", "blocks"), [
    ("", False),
    ("loadpin.enforce=1", True),
    ("loadpin.enforce=1 loadpin.exclude=kernel-module", False),
    ("loadpin.enforce=1 loadpin.exclude=kexec-image,kernel-module", False),
    ("loadpin.enforce=1 loadpin.exclude=kexec-image", True),
    ("loadpin.enforce=0", False),
])
def test_loadpin_blocks_modules_unless_excluded(cmdline, blocks):
    # COS images boot with loadpin.exclude=kernel-module so out-of-tree modules can load.
    assert decide(KernelSigning(cmdline=cmdline)).loadpin_blocks is blocks


def test_read_from_procfs_and_sysfs(fake_kernel):
    k = KernelState(fake_kernel.proc_dir, fake_kernel.sys_dir, fake_kernel.dev_dir)
    assert signing.policy(k).enforced is False
    fake_kernel.set_cmdline("console=ttyS0 module.sig_enforce=1 loadpin.enforce=1")
    fake_kernel.set_lockdown("integrity")
    efivar = fake_kernel.sys_dir / signing.SECURE_BOOT_EFIVAR
    efivar.parent.mkdir(parents=True)
    efivar.write_bytes(b"\x06\x00\x00\x00\x01")  # 4 attribute bytes, then the value
    state = signing.read(k)
    assert state == KernelSigning("console=ttyS0 module.sig_enforce=1 loadpin.enforce=1",
                                  state.sig_enforce_param, "integrity", True)
    policy = signing.policy(k)
    assert policy.loadpin_blocks and policy.lockdown == "integrity"
    assert policy.reasons[0] == "Secure Boot is on"
    efivar.write_bytes(b"\x06\x00\x00\x00\x00")
    assert signing.read(k).secure_boot is False
