"""Will this kernel refuse unsigned modules, and why: the one rule the install checks,
module loading and doctor share.

The kernel's own state decides: ``module.sig_enforce`` (command line or the sysfs
parameter, docs/contract.md §4) and lockdown (integrity or confidentiality
refuses unsigned modules, kernel/module/signing.c ``module_sig_check``). EFI Secure
Boot is the usual cause of both (Ubuntu's kernel enters lockdown under it) but not
a refusal by itself: a kernel booted with it and neither enforcing loads unsigned
modules. LoadPin (COS) refuses modules from outside the root filesystem, signed or
not, unless ``loadpin.exclude=kernel-module``.
"""

from __future__ import annotations

from installer.base.dataclass import dataclass
from installer.base.errors import SecureBootError
from installer.kmod.kernel import KernelState

SIG_ENFORCE_PARAM = "module/module/parameters/sig_enforce"
SECURE_BOOT_EFIVAR = "firmware/efi/efivars/SecureBoot-8be4df61-93ca-11d2-aa0d-00e098032b8c"
LOCKDOWN = "kernel/security/lockdown"


def cmdline_enforces_signatures(cmdline: str) -> bool:
    return any(
        word in ("module.sig_enforce=1", "module.sig_enforce=y", "module.sig_enforce=Y")
        for word in cmdline.split()
    )


def parse_lockdown(text: str) -> str:
    """``none [integrity] confidentiality`` -> ``integrity``."""
    for word in text.split():
        if word.startswith("[") and word.endswith("]"):
            return word[1:-1]
    return "none"


@dataclass(frozen=True)
class KernelSigning:
    """What the kernel says, as read from procfs/sysfs."""

    cmdline: str = ""
    sig_enforce_param: str = ""  # "Y", "N" or "" (unreadable)
    lockdown: str = "none"
    secure_boot: bool | None = None  # None: no EFI variable (not EFI, or not readable)


@dataclass(frozen=True)
class SigningPolicy:
    reasons: tuple[str, ...]  # why only signed modules load (empty: unsigned ones load)
    loadpin_blocks: bool  # LoadPin refuses every module from outside the root filesystem
    lockdown: str  # "none", "integrity" or "confidentiality"
    secure_boot: bool | None

    @property
    def enforced(self) -> bool:
        return bool(self.reasons)

    def why(self) -> str:
        return "; ".join(self.reasons)


def decide(k: KernelSigning) -> SigningPolicy:
    reasons = []
    if cmdline_enforces_signatures(k.cmdline):
        reasons.append("module.sig_enforce=1 is on the kernel command line")
    elif k.sig_enforce_param in ("Y", "1"):
        reasons.append(f"module.sig_enforce is on ({SIG_ENFORCE_PARAM} is Y)")
    if k.lockdown != "none":
        reasons.append(f"kernel lockdown={k.lockdown}")
    if reasons and k.secure_boot:
        reasons.insert(0, "Secure Boot is on")
    words = k.cmdline.split()
    excluded = any(
        w.startswith("loadpin.exclude=") and "kernel-module" in w.partition("=")[2].split(",")
        for w in words
    )
    return SigningPolicy(tuple(reasons), "loadpin.enforce=1" in words and not excluded,
                         k.lockdown, k.secure_boot)


def read(kernel: KernelState) -> KernelSigning:
    def text(rel: str) -> str:
        try:
            return (kernel.sys_dir / rel).read_text(errors="replace").strip()
        except OSError:
            return ""

    try:
        efivar = (kernel.sys_dir / SECURE_BOOT_EFIVAR).read_bytes()
        secure_boot: bool | None = bool(efivar) and efivar[-1] == 1  # 4 attribute bytes, value
    except OSError:
        secure_boot = None
    return KernelSigning(kernel.cmdline(), text(SIG_ENFORCE_PARAM),
                         parse_lockdown(text(LOCKDOWN)), secure_boot)


def policy(kernel: KernelState) -> SigningPolicy:
    return decide(read(kernel))


def refusal(policy: SigningPolicy, unsigned: str, instead: str, **fields: str | None
            ) -> SecureBootError:
    """The exit-10 refusal, before any big download: the kernel only loads signed modules
    and ``unsigned`` (what this run would load); ``instead``: the way out this flow has.
    One message for every flow (headers builds, bundles, COS)."""
    return SecureBootError(
        f"this node only loads signed kernel modules ({policy.why()}) and {unsigned}",
        hint=f"{instead}, or use a node pool without module signature enforcement "
        "(Secure Boot, module.sig_enforce); this installer never edits boot config or reboots",
        **fields)
