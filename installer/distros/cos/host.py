"""What identifies Container-Optimized OS and what its DaemonSet needs; its plans live in
``flow`` (imported only where installs are planned: the artifacts client and the archive
code are not needed to recognise a host)."""

from __future__ import annotations

import re

from installer.base import podcontract
from installer.base.branches import EXAMPLE_BRANCH
from installer.base.errors import UnsupportedHostError
from installer.distros.base import Distro, SignedModules, StaleCache
from installer.distros.cos.options import CosOptions
from installer.distros.daemonset import DaemonSetNeeds, HostMount
from installer.host.osinfo import HostInfo, parse_env_file
from installer.records.cachekey import CacheKey

# The build's driver version aliases (its gpu_<alias>_version files): default, latest and a
# branch, R535 (r535 and 535 name it too). ``manifests render`` and ``install`` both read
# this one rule (artifacts.parse_requested turns a match into the alias file's name).
VERSION_ALIAS = re.compile(r"(?i:(?P<name>default|latest)|r?(?P<branch>[0-9]{3,}))")


# As GKE's COS DaemonSets: the toolchain cache and the Vulkan ICD dir, named in env too.
TOOLS_DIR = HostMount("cos-tools", str(podcontract.COS_TOOLS_DIR_HOST),
                      str(podcontract.COS_TOOLS_DIR_CONTAINER), "DirectoryOrCreate",
                      "COS toolchain cache: kept across pod restarts and reinstalls.")
VULKAN_ICD_DIR = HostMount(
    "vulkan-icd-mount", str(podcontract.VULKAN_ICD_DIR_HOST),
    str(podcontract.VULKAN_ICD_DIR_CONTAINER), "DirectoryOrCreate",
    "NVIDIA's Vulkan ICD file (nvidia_icd.json), as GKE's COS DaemonSet.")
DAEMONSET = DaemonSetNeeds(
    mounts=(TOOLS_DIR, VULKAN_ICD_DIR),
    env=(("COS_TOOLS_DIR_HOST", TOOLS_DIR.host_path),
         ("COS_TOOLS_DIR_CONTAINER", TOOLS_DIR.mount_path),
         ("VULKAN_ICD_DIR_HOST", VULKAN_ICD_DIR.host_path),
         ("VULKAN_ICD_DIR_CONTAINER", VULKAN_ICD_DIR.mount_path)),
    own_env=("COS_DOWNLOAD_GCS", "COS_ARTIFACTS_SHA256"),
    host_network=("hostNetwork, as GKE's COS DaemonSet: downloads start at node bring-up,",
                  "before the CNI may be ready, and use no pod IP."),
    # As GKE's COS DaemonSets (container-engine-accelerators nvidia-driver-installer/cos/
    # daemonset-preloaded*.yaml @068b15a, L111-127; its ubuntu/*.yaml have none).
    partition_gpus=True,
)


class Cos(Distro):
    """What identifies COS; ``flow.CosFlow`` plans its installs."""

    name = "cos"
    title = "Container-Optimized OS"
    os_ids = ("cos",)
    default_version = "default"  # the build's gpu_default_version (artifacts.DEFAULT_ALIAS)
    daemonset = DAEMONSET
    version_alias = VERSION_ALIAS
    version_alias_help = f"default, latest, R<branch> such as {EXAMPLE_BRANCH}"
    gke_os_distributions = ("cos", "cos_containerd")
    signed_modules = SignedModules(
        offer="COS installs use NVIDIA's signed prebuilt modules",
        fix="run install: it fetches the signed modules for this COS build; if there are none "
        "for the driver version, pick one that has them (default/latest)",
    )
    options = CosOptions
    flow = "cos"  # flow.CosFlow
    stale_cache = StaleCache(likely_cause="node image upgraded?",
                             install_does="reinstalls for this build")

    @classmethod
    def node_key(cls, info: HostInfo, driver_version: str) -> CacheKey:
        """COS installs are keyed by the OS build (its kernel and signing keys come with it)."""
        return CacheKey(driver_version, build_id=info.build_id)

    @classmethod
    def recognise(cls, fields: dict[str, str], lsb_release: str | None, kernel_release: str,
                  os_release_path: str) -> HostInfo | None:
        if fields.get("ID", "").lower() != "cos":  # ID_LIKE=cos names no COS build
            return None
        build_id = fields.get("BUILD_ID", "")
        parts = build_id.split(".")
        if len(parts) < 2 or not all(p.isdigit() for p in parts):
            what = "no BUILD_ID" if not build_id else f"a malformed BUILD_ID {build_id!r}"
            raise UnsupportedHostError(
                f"{os_release_path} has {what}; a COS host must name its build",
                hint="expected BUILD_ID=<major>.<minor>.<patch>, e.g. BUILD_ID=17800.66.78",
                path=os_release_path,
            )
        board = parse_env_file(lsb_release or "").get("CHROMEOS_RELEASE_BOARD") or None
        return HostInfo("cos", cls.name, fields.get("VERSION_ID", ""),
                        fields.get("PRETTY_NAME", "cos"), kernel_release, build_id, board)
