"""Host state as an attacker leaves it: a planted lock file, symlinked host dirs, an
uninstall pointed at the wrong dir. Every write must stay inside the host root (chroot
semantics), and the host's own files must survive.
"""

from __future__ import annotations

import os

import pytest

from tests.attacks.conftest import INSTALL_HOST, outcome

pytestmark = pytest.mark.chroot

LOCK = "tmp/cos_gpu_installer_lock"


# -- case 2: the host lock ------------------------------------------------------------


def test_lock_symlinked_to_a_host_file_is_replaced_and_the_file_kept(ubuntu):
    """No process holds a link: it is replaced by a file of ours, never followed (issue 39,
    the lock trap; it was refused, exit 4, which a planted link made a node-wide block)."""
    victim = ubuntu.node.path("/etc/hostname")
    victim.write_text("gpu-node-1\n")
    os.symlink("/etc/hostname", ubuntu.node.path("/" + LOCK))
    proc = ubuntu.run("install")
    outcome(proc, 0)
    assert victim.read_text() == "gpu-node-1\n"
    assert not ubuntu.node.path("/" + LOCK).is_symlink()
    ubuntu.assert_host_unchanged(installed=True)


def test_lock_file_of_another_user_no_process_holds_is_replaced_not_written(ubuntu):
    """Another user's stale lock (a non-root run's, before issue 39) is replaced: its entry
    renamed over, the file itself never opened for writing or truncated."""
    lock = ubuntu.node.path("/" + LOCK)
    lock.write_text("a file a local user made\n")
    os.chown(lock, 65534, 65534)
    fd = os.open(lock, os.O_RDONLY)  # the old file, as its owner still sees it
    try:
        proc = ubuntu.run("install")
        outcome(proc, 0)
        assert os.pread(fd, 100, 0) == b"a file a local user made\n"
        assert lock.stat().st_uid == 0
    finally:
        os.close(fd)
    ubuntu.assert_host_unchanged(installed=True)


# -- case 3: writes that would leave the host root ------------------------------------


def _aim_at_canary(world, host_dir: str) -> str:
    """Replace the host's ``host_dir`` by an absolute symlink to <canary>/<name>: on the host
    that names <host-root><canary>/<name>; in the container, the canary itself."""
    target = world.canary / host_dir.strip("/").replace("/", "-")
    link = world.node.path(host_dir)
    link.parent.mkdir(parents=True, exist_ok=True)
    inside = world.node.path(str(target))
    inside.parent.mkdir(parents=True, exist_ok=True)
    if link.is_dir() and not link.is_symlink():
        os.rename(link, inside)  # keep its content, on the host side
    os.symlink(str(target), link)
    return str(target)


@pytest.mark.parametrize("host_dir, written", [
    ("/run", "nvidia/validations/driver-ready"),
    ("/etc/ld.so.conf.d", "nvidia.conf"),
])
def test_symlinked_host_dirs_are_written_inside_the_host_root(ubuntu, host_dir, written):
    target = _aim_at_canary(ubuntu, host_dir)
    ubuntu.node.path(target).mkdir(parents=True, exist_ok=True)
    proc = ubuntu.run("install")
    outcome(proc, 0, "installed and verified")
    assert ubuntu.node.path(f"{target}/{written}").is_file()  # where the host reads it
    ubuntu.assert_host_unchanged(installed=True, also=(target,))


def test_metrics_file_under_a_symlinked_dir_stays_inside(ubuntu):
    target = _aim_at_canary(ubuntu, "/var/lib/node_exporter")
    proc = ubuntu.run("install", "--metrics-file", "/var/lib/node_exporter/nvidia.prom")
    outcome(proc, 0, "installed and verified")
    assert "nvidia_driver_installer_success 1" in \
        ubuntu.node.path(f"{target}/nvidia.prom").read_text()
    ubuntu.assert_host_unchanged(installed=True, also=(target,))


def test_cos_tools_dir_behind_a_symlink_stays_inside(cos):
    target = _aim_at_canary(cos, "/var/lib/cos-tools")
    proc = cos.run("install")
    outcome(proc, 0, "installed and verified")
    assert cos.node.path(f"{target}/17801.218.41/toolchain/bin").is_dir()
    cos.assert_host_unchanged(installed=True, also=(target,))


def test_kubectl_debug_install_dir_fallback_resolves_on_the_host(ubuntu):
    """No /usr/local/nvidia in the container: the install dir is <host-root>/<install-dir-host>,
    resolved on the host even when /home/kubernetes is a symlink there."""
    ubuntu.pod.mount_install_dir = False
    target = _aim_at_canary(ubuntu, "/home/kubernetes")
    proc = ubuntu.run("install")
    outcome(proc, 0, "installed and verified")
    assert ubuntu.node.path(f"{target}/bin/nvidia/bin/nvidia-smi").is_file()
    ubuntu.assert_host_unchanged(installed=True, also=(target,))


def test_symlinked_ld_so_conf_keeps_its_link_and_its_include(ubuntu):
    conf = ubuntu.node.path("/etc/ld.so.conf")
    alt = ubuntu.node.path("/etc/alternatives/ld.so.conf")
    alt.parent.mkdir(parents=True)
    os.replace(conf, alt)
    os.symlink("/etc/alternatives/ld.so.conf", conf)
    proc = ubuntu.run("install")
    outcome(proc, 0, "installed and verified")
    assert os.readlink(conf) == "/etc/alternatives/ld.so.conf"
    assert alt.read_text().startswith("include /etc/ld.so.conf.d/*.conf")
    assert ubuntu.node.path("/etc/ld.so.conf.d/nvidia.conf").read_text() == \
        f"{INSTALL_HOST}/lib64\n"
    ubuntu.assert_host_unchanged(installed=True)


# -- case 4: uninstall pointed at the wrong dir -----------------------------------------


def test_uninstall_of_the_host_root_itself_is_refused(ubuntu):
    ubuntu.pod.mount_install_dir = False
    for rel in ("bin/sh", "lib64/ld-linux-x86-64.so.2"):
        ubuntu.node.path("/" + rel).parent.mkdir(parents=True, exist_ok=True)
        ubuntu.node.path("/" + rel).write_text("the host's own\n")
    proc = ubuntu.run("uninstall", "--install-dir-host", "/")
    outcome(proc, 2, "not an NVIDIA install dir", "not removing")
    assert ubuntu.node.path("/bin/sh").read_text() == "the host's own\n"
    ubuntu.assert_host_unchanged()


def test_uninstall_with_a_path_climbing_out_of_the_host_root_is_refused(ubuntu):
    ubuntu.pod.mount_install_dir = False
    proc = ubuntu.run("uninstall", "--install-dir-host", "/../../etc")
    outcome(proc, 2, "without '..'")
    ubuntu.assert_host_unchanged()


def test_symlinked_firmware_updates_dir_stays_inside(ubuntu):
    ubuntu.kernel.drop_firmware_path()  # so the firmware is copied into /lib/firmware/updates
    target = ubuntu.canary / "firmware"  # exists in the container, and on the host side too
    target.mkdir()
    ubuntu.node.path(str(target)).mkdir(parents=True)
    link = ubuntu.node.path("/lib/firmware/updates/nvidia")
    link.parent.mkdir(parents=True)
    os.symlink(str(target), link)
    proc = ubuntu.run("install")
    outcome(proc, 0, "installed and verified")
    assert list(target.iterdir()) == [], "firmware copied outside the host root"
    assert list(ubuntu.node.path(str(target)).rglob("gsp_*.bin"))


# -- issue 33 item 8: an --install-dir-host that is not the install dir ----------------------


@pytest.mark.parametrize("host_path", ["/", "/etc", "/home/kubernetes/bin"])
def test_an_install_dir_host_that_is_not_the_install_dir_is_refused(ubuntu, host_path):
    """The host's ld.so.conf entry and driver-ready name <install-dir-host>: it must be the
    dir the pod mounts at --install-dir (same device and inode), else exit 2 before
    anything changes. On abf8713 ``/`` and ``/etc`` installed (exit 0) and pointed the
    host's nvidia.conf at /lib64 and /etc/lib64."""
    proc = ubuntu.run("install", "--install-dir-host", host_path)
    outcome(proc, 2, f"--install-dir-host {host_path}", "not the directory")
    ubuntu.assert_host_unchanged()
