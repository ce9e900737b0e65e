"""case 15: a hostile .run. Its makeself header (``sh X.run -x``), its kernel Makefile and
its nvidia-installer each try to leave the build jail (tests/attacks/jail_attack.py):
write through /proc/1/root outside the host root and into it, read the installer's
environment, init_module, write /sys/module, mount, ptrace a privileged process, open or
make a block device, read the bundle signing key. Every attempt must fail inside; the
payload still installs (exit 0) and nothing outside the install dir changed.

Under the old sandbox (unshare --mount + chroot into an overlay of /, the container's
/dev, /proc and /sys, all capabilities) the header's attempt escapes first (the canary
through /proc/1/root, the installer's environ, CAP_SYS_MODULE, mount, ptrace, block
devices, the key on the container's root filesystem), so the install fails with exit 7
"could not extract" naming them: checked on bb31daf^ (docs/jail.md).
"""

from __future__ import annotations

import base64
import re
from pathlib import Path

import pytest

from tests.attacks.conftest import V, doctored_run, outcome

pytestmark = pytest.mark.chroot

SECRET = "jail-test-secret-3f9c1e"
ATTACK = Path(__file__).with_name("jail_attack.py")


def attack_script(canary: Path | str = "", key: Path | str = "") -> str:
    """jail_attack.py with the test's values filled in (the host root is /root in the pod)."""
    return (ATTACK.read_text().replace("@CANARY@", str(canary)).replace("@KEY@", str(key))
            .replace("@SECRET@", SECRET).replace("@HOST@", "/root"))


def attack_header(script: str, *args: str) -> str:
    """A makeself header line running ``script`` with ``args`` (base64: the header is a
    here-document to makeself, no $ or quotes of its own, doctored_run)."""
    code = base64.b64encode(script.encode()).decode()
    argv = ",".join(repr(a) for a in ("-", *args))
    return (f"python3 -c \"import base64,sys;sys.argv=[{argv}];"
            f"exec(base64.b64decode('{code}'))\" || exit 1")


def hostile_run(out: Path, canary: Path, key: Path) -> Path:
    """The stock payload whose header, Makefiles and nvidia-installer run the attacks first."""
    script = attack_script(canary, key)
    return doctored_run(
        out, header=attack_header(script, "header"), files={".attack.py": script},
        installer='python3 "$(dirname "$0")/.attack.py" nvidia-installer || exit 1\n'
        'exec "$(dirname "$0")/.nvidia-installer-real" "$@"',
        makefile="@python3 $(CURDIR)/../.attack.py make")


def test_a_hostile_run_cannot_leave_the_build_jail(ubuntu, tmp_path):
    key = tmp_path / "signing.key"  # bundle build --signing-key's file, in the container
    key.write_text("-----BEGIN PRIVATE KEY-----\nnot a real key\n")
    ubuntu.server.serve_run(V, hostile_run(tmp_path / "hostile", ubuntu.canary, key))
    proc = ubuntu.run("install", env={"NDI_JAIL_SECRET": SECRET})
    outcome(proc, 0)
    build_log = (ubuntu.node.install_dir / "kernel-build.log").read_text()
    attacks = re.search(r"jail-attacks make: (\d+) blocked of (\d+)", build_log)
    assert attacks and attacks[1] == attacks[2] and int(attacks[1]) >= 17, build_log[-3000:]
    # Issue 33 item 1: bwrap 0.8 leaves /proc/sys writable to the jail's uid 0.
    for target in ("/proc/sys/kernel/core_pattern", "/proc/sys/vm/drop_caches"):
        assert f"write {target} (Read-only file system)" in build_log, build_log[-3000:]
    ubuntu.assert_host_unchanged(installed=True)


def test_bundle_build_keeps_the_signing_key_out_of_the_jail(tmp_path, canary):
    """``bundle build --signing-key``: the key is a file of the build pod; the hostile .run
    builds and nvidia-installer runs in the jail, which cannot read it (exit 1 -> exit 7),
    and the modules are still signed with it afterwards, outside."""
    from tests.fixtures.server import ArtifactServer
    from tests.integration.test_bundle import RELEASE, build_bundle, install_sign_file

    key, cert = tmp_path / "mok.key", tmp_path / "mok.crt"
    key.write_text("KEY")  # what the sign-file stand-in accepts
    cert.write_text("CERT")

    with ArtifactServer() as server:
        server.serve_run(V, hostile_run(tmp_path / "hostile", canary, key))
        _, _, doc, compiled = build_bundle(tmp_path / "build", server, RELEASE,
                                           "--signing-key", str(key), "--signing-cert",
                                           str(cert), setup=install_sign_file)
    assert compiled and doc["signed"] is True, doc
    assert sorted(p.name for p in canary.iterdir()) == ["sentinel"]


def test_cos_mkprecompiled_runs_in_the_jail(cos, tmp_path):
    """COS's precompiled flavour unpacks the custom .run's kernel interfaces with the .run's
    own ``mkprecompiled``: NVIDIA's code, so in the jail like the header. A hostile one
    writing to the host's /etc writes into the jail's /root tmpfs instead; the install
    still succeeds. On abf8713 it ran in the container as root: /etc/pwned-mkprecompiled
    appeared on the host."""
    from tests.cosbucket import DEFAULT_V, MKPRECOMPILED, _wrapped_run, precompiled_pieces
    from tests.fixtures.node import COS_KERNEL

    hostile = MKPRECOMPILED.replace(
        "#!/bin/sh\n", "#!/bin/sh\necho pwned > /root/etc/pwned-mkprecompiled 2>/dev/null\n", 1)
    run = _wrapped_run(tmp_path / f"NVIDIA-Linux-x86_64-{DEFAULT_V}-custom.run", DEFAULT_V,
                       {"mkprecompiled": hostile.encode(),
                        **precompiled_pieces(DEFAULT_V, COS_KERNEL)})
    cos.kernel.add_gpu(device="0x1db4")  # a V100: proprietary modules only
    cos.kernel.set_sig_enforce(True)  # so: the precompiled, Google-signed flavour
    cos.bucket.custom_runs = {DEFAULT_V: run}
    cos.bucket.signature_versions = (DEFAULT_V,)
    proc = cos.run("install")
    outcome(proc, 0)
    assert "CACHE_FLAVOR=precompiled-signed" in (cos.node.install_dir / ".cache").read_text()
    assert not cos.node.path("/etc/pwned-mkprecompiled").exists()
    cos.assert_host_unchanged(installed=True)
