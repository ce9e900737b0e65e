"""What every distro declares: how it is recognised, its default driver version, its
title, image and DaemonSet, its own options, how its installs are keyed. Facts only:
the plans are its flow's (``planning.Flow``), so recognising a host stays cheap."""

from __future__ import annotations

import abc
import re
from typing import ClassVar

from installer.base.branches import EXAMPLE_VERSION
from installer.base.dataclass import dataclass
from installer.base.values import is_driver_version
from installer.distros.daemonset import DaemonSetNeeds
from installer.host.osinfo import HostInfo
from installer.records.cachekey import CacheKey
from installer.settings import DistroOptions, Settings


@dataclass(frozen=True)
class SignedModules:
    """Where a distro gets modules a kernel enforcing signatures accepts."""

    offer: str  # e.g. "COS installs use NVIDIA's signed prebuilt modules"
    fix: str  # what to do on a node where none are loaded yet


@dataclass(frozen=True)
class StaleCache:
    """Why a cached install no longer matches a node of this distro."""

    likely_cause: str  # e.g. "kernel updated?"
    install_does: str  # what the next install does about it


class Distro(abc.ABC):
    # The distro's name: HostInfo.distro, ``manifests render --flavor`` (and, unless
    # image_suffix says otherwise, the image's suffix).
    name: ClassVar[str]
    title: ClassVar[str]  # e.g. "Ubuntu", in manifests and messages
    # os-release ID (or one of ID_LIKE) values this distro handles.
    os_ids: ClassVar[tuple[str, ...]]
    default_version: ClassVar[str]  # what NVIDIA_DRIVER_VERSION defaults to in the manifests
    # Names the node resolves to a driver version (COS: default, latest, R535) and how
    # messages list them; None: explicit versions only.
    version_alias: ClassVar[re.Pattern[str] | None] = None
    version_alias_help: ClassVar[str] = ""
    # GKE's cloud.google.com/gke-os-distribution values (the *_containerd names are the
    # image-type spellings GKE has also used).
    gke_os_distributions: ClassVar[tuple[str, ...]]
    # Its DaemonSet's own mounts, env and network; its image is
    # nvidia-driver-installer-<image_suffix> (None: its own name).
    daemonset: ClassVar[DaemonSetNeeds] = DaemonSetNeeds()
    image_suffix: ClassVar[str | None] = None
    # Where this distro gets modules a signature-enforcing kernel accepts (None: it only
    # builds unsigned modules).
    signed_modules: ClassVar[SignedModules | None] = None
    # Its own options (Settings.distro_options; None: it has none), e.g. cos/options.py.
    options: ClassVar[type[DistroOptions] | None] = None
    # How it installs: the key of its flow in ``flows.FLOWS`` (e.g. "headers_build"), so a
    # distro that installs as another does names that flow and adds no class of its own.
    flow: ClassVar[str]
    # When a cached install is stale on this distro's nodes (doctor's advice).
    stale_cache: ClassVar[StaleCache] = StaleCache(likely_cause="kernel updated?",
                                                   install_does="rebuilds for the running kernel")

    @classmethod
    def recognise(cls, fields: dict[str, str], lsb_release: str | None, kernel_release: str,
                  os_release_path: str) -> HostInfo | None:
        """The host facts when os-release ``fields`` name this distro, else None."""
        os_id = fields.get("ID", "").lower()
        id_like = fields.get("ID_LIKE", "").lower().split()
        if os_id not in cls.os_ids and not set(id_like) & set(cls.os_ids):
            return None
        return HostInfo(os_id, cls.name, fields.get("VERSION_ID", ""),
                        fields.get("PRETTY_NAME", os_id), kernel_release)

    @classmethod
    def support(cls, info: HostInfo) -> str:
        """How this flow serves the host, said honestly (``detect``, the install log)."""
        if info.os_id == cls.name:
            return "supported"
        if info.os_id in cls.os_ids:
            return f"supported: {info.os_id.capitalize()} via the {cls.title} flow"
        return (f"not tested: {info.os_id} follows the {cls.title} flow because its os-release "
                f"ID_LIKE names {'/'.join(cls.os_ids)}")

    @classmethod
    def node_key(cls, info: HostInfo, driver_version: str) -> CacheKey:
        """What an install of ``driver_version`` on this node is keyed by (here: the
        kernel it was built for)."""
        return CacheKey(driver_version, kernel_release=info.kernel_release)

    @classmethod
    def image(cls) -> str:
        """The suffix of its image's name (``{flavor}`` in ``manifests render --image``)."""
        return cls.image_suffix or cls.name

    @classmethod
    def check_version_request(cls, value: str) -> str:
        """``value`` when this distro installs it (a version or one of its aliases), else
        ValueError saying what it accepts."""
        if is_driver_version(value) or (cls.version_alias and cls.version_alias.fullmatch(value)):
            return value
        if cls.version_alias:
            raise ValueError(f"driver version {value!r} for {cls.name} is neither a version "
                             f"(e.g. {EXAMPLE_VERSION}) nor an alias ({cls.version_alias_help})")
        raise ValueError(f"driver version {value!r} for {cls.name} must be an explicit version "
                         f"(e.g. {EXAMPLE_VERSION}); it has no aliases")

    @classmethod
    def unpinned_artifacts(cls, settings: Settings) -> str | None:
        """What this distro downloads besides the .run that nothing pins (None: all pinned,
        or nothing else)."""
        return settings.options(cls.options).unpinned() if cls.options else None
