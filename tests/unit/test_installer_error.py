"""The one line a failed NVIDIA build is summed up in."""
# ruff: noqa: E501  (verbatim log lines)

from __future__ import annotations

from installer.driver.nvidia_run import installer_error
from installer.host.installdir import Tree

# The real tail of NVIDIA 535.261.03's open modules failing on Debian's 6.1.0-56 headers
# (seen in the real-parts tier), paths as inside our sandbox.
REAL_535_OPEN_FAILURE = """\
-> Building kernel modules
   executing: 'cd /tmp/nvidia-driver-installer/extract/kernel-open; make -k -j2 ...'...
   /tmp/nvidia-driver-installer/extract/kernel-open/nvidia/nv-pci.c: In function 'nv_resize_pcie_bars':
   /tmp/nvidia-driver-installer/extract/kernel-open/nvidia/nv-pci.c:223:9: error: too few arguments to function 'pci_resize_resource'
     223 |     r = pci_resize_resource(pci_dev, NV_GPU_BAR1, requested_size);
   /root/usr/src/linux-headers-6.1.0-56-common/include/linux/pci.h:1388:18: note: declared here
   make[3]: *** [/root/usr/src/linux-headers-6.1.0-56-common/scripts/Makefile.build:255: nv-pci.o] Error 1
ERROR: An error occurred while performing the step: "Building kernel modules". See /var/log/nvidia-installer.log for details.
ERROR: The nvidia kernel module was not created.
ERROR: Installation has failed.  Please see the file '/var/log/nvidia-installer.log' for details.
"""


def test_first_compiler_error_and_the_failed_step(tmp_path):
    staging = Tree(tmp_path)
    (tmp_path / "nvidia-installer.log").write_text(REAL_535_OPEN_FAILURE)
    assert installer_error(staging) == (
        "kernel-open/nvidia/nv-pci.c:223:9: error: too few arguments to function "
        "'pci_resize_resource' | ERROR: An error occurred while performing the step: "
        "\"Building kernel modules\". See /var/log/nvidia-installer.log for details.")


def test_without_a_compiler_error_the_installers_errors(tmp_path):
    (tmp_path / "nvidia-installer.log").write_text(
        "ERROR: Unable to find the kernel source tree for the currently running kernel.\n"
        "ERROR: Installation has failed.\n")
    assert installer_error(Tree(tmp_path)) == (
        "ERROR: Unable to find the kernel source tree for the currently running kernel. | "
        "ERROR: Installation has failed.")


def test_no_log_at_all(tmp_path):
    assert installer_error(Tree(tmp_path)) == "(no output)"
