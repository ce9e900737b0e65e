"""The artifacts Google publishes for each COS build (docs/contract.md §6), and driver version aliases.

Layout under the artifacts URL of a build (``--cos-artifacts-url`` /
``COS_DOWNLOAD_GCS``, a template with ``{build_id}`` and ``{board}``):
``kernel-headers.tgz``, ``toolchain.tar.xz`` or ``toolchain_url``,
``toolchain_env``, ``gpu_default_version``, ``gpu_latest_version``,
``gpu_<alias>_version``, prebuilt signed modules ``nvidia-drivers-<V>.tgz``, and
under ``extensions/gpu/`` the precompiled proprietary driver
``NVIDIA-Linux-x86_64-<V>-custom.run`` with Google's module signatures
``nvidia-drivers-<V>-signature.tar.gz``.

Everything is fetched anonymously: no metadata-server token is ever added
(public buckets answer 401 to a bad one, cos-gpu-installer#80), nor the
host's ``.netrc`` (net/session.py). Credentials reach a request only if the
operator put them in a URL (a proxy, ``user:pass@``, a signed URL).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import TYPE_CHECKING

import structlog

from installer.base.branches import EXAMPLE_BRANCH, EXAMPLE_VERSION
from installer.base.dataclass import dataclass
from installer.base.errors import DownloadError, IntegrityError, UnsupportedHostError, UsageError
from installer.base.values import is_driver_version
from installer.distros.cos.host import VERSION_ALIAS
from installer.distros.cos.pins import Manifest
from installer.distros.cos.toolchain import check_toolchain_env
from installer.host.osinfo import parse_env_file
from installer.net.fetch import fetch_text, url_exists
from installer.net.policy import from_metadata
from installer.net.retry import RetryPolicy

if TYPE_CHECKING:
    from installer.net.session import ArtifactSession

log = structlog.get_logger(__name__)

KERNEL_HEADERS = "kernel-headers.tgz"
TOOLCHAIN_ARCHIVE = "toolchain.tar.xz"
TOOLCHAIN_URL_FILE = "toolchain_url"
TOOLCHAIN_ENV_FILE = "toolchain_env"
# What both Google installers use when a build has no toolchain_env.
DEFAULT_TOOLCHAIN_ENV = {"CC": "x86_64-cros-linux-gnu-gcc", "CXX": "x86_64-cros-linux-gnu-g++"}

DEFAULT_ALIAS = "default"
LATEST_ALIAS = "latest"
_PLACEHOLDER_RE = re.compile(r"\{([^{}]*)\}")


class MissingArtifactError(DownloadError):
    """The build publishes no such artifact (a 404), as opposed to a network failure."""


def prebuilt_modules_name(version: str) -> str:
    return f"nvidia-drivers-{version}.tgz"


EXTENSIONS_GPU = "extensions/gpu"


def custom_run_name(version: str) -> str:
    """The precompiled (proprietary) driver package of this build's kernel."""
    return f"{EXTENSIONS_GPU}/NVIDIA-Linux-x86_64-{version}-custom.run"


def signatures_name(version: str) -> str:
    """Google's detached PKCS#7 signatures (``<module>.ko.sig``) for the modules
    linked from the custom .run."""
    return f"{EXTENSIONS_GPU}/nvidia-drivers-{version}-signature.tar.gz"


def version_file_name(alias: str) -> str:
    return f"gpu_{alias}_version"


def artifacts_base(template: str, *, build_id: str, board: str | None) -> str:
    """Fill ``{build_id}`` and ``{board}`` into the artifacts URL template."""
    def fill(m: re.Match[str]) -> str:
        name = m.group(1)
        if name == "build_id":
            return build_id
        if name == "board":
            if not board:
                # The host, not the flag, lacks what the template needs.
                raise UnsupportedHostError(
                    "the COS artifacts URL needs {board}, but the host's /etc/lsb-release "
                    "has no CHROMEOS_RELEASE_BOARD",
                    hint="use an artifacts URL without {board} (--cos-artifacts-url / "
                    "COS_DOWNLOAD_GCS), or check --host-root",
                    path="/etc/lsb-release",
                )
            return board
        raise UsageError(
            f"unknown placeholder {{{name}}} in the COS artifacts URL {template!r}",
            hint="only {build_id} and {board} are filled in",
        )

    return _PLACEHOLDER_RE.sub(fill, template).rstrip("/")


def join(base: str, name: str) -> str:
    return f"{base.rstrip('/')}/{name.lstrip('/')}"


# --------------------------------------------------------------------------- versions


@dataclass(frozen=True)
class Requested:
    """What ``--driver-version`` asked for: a concrete version or an alias file to read."""

    raw: str
    version: str | None = None  # set for an explicit version
    alias: str | None = None  # "default", "latest", "R535"


def parse_requested(raw: str | None) -> Requested:
    """``None``/empty -> ``default``; ``R535``/``r535``/``535`` -> ``R535``; versions as given."""
    value = (raw or "").strip() or DEFAULT_ALIAS
    if is_driver_version(value):
        return Requested(value, version=value)
    m = VERSION_ALIAS.fullmatch(value)
    if m:
        return Requested(value, alias=m["name"].lower() if m["name"] else f"R{m['branch']}")
    raise UsageError(
        f"--driver-version {value!r} is neither a driver version nor a COS alias",
        hint=f"use a version such as {EXAMPLE_VERSION}, or default, latest, or a branch such as "
        f"{EXAMPLE_BRANCH}",
    )


@dataclass(frozen=True)
class Resolved:
    version: str
    requested: str
    alias: str | None = None
    source_url: str | None = None  # the gpu_*_version file it came from
    note: str | None = None  # why it is not what the alias first named

    def describe(self) -> dict[str, str | None]:
        doc = {"requested_version": self.requested, "version_alias": self.alias,
               "version_source": self.source_url}
        if self.note:
            doc["version_note"] = self.note
        return doc


def resolve_version(
    requested: Requested,
    fetch: Callable[[str], str | None],
    *,
    base: str,
    build_id: str,
) -> Resolved:
    """The concrete version; alias files are read through ``fetch(name)`` (None: absent)."""
    if requested.version is not None:
        return Resolved(requested.version, requested.raw)
    assert requested.alias is not None
    name = version_file_name(requested.alias)
    url = join(base, name)
    text = fetch(name)
    if text is None:
        # Exit 5 (download), not 2 (usage): a missing alias file is a 404 at a URL,
        # and from here "this build offers no such branch" cannot be told apart
        # from "the artifacts URL is wrong, or not published yet, or a mirror is
        # incomplete". The operator's next step is the same as for any missing
        # artifact: look at that URL. Malformed alias *syntax* is refused as
        # usage (exit 2) before any request.
        raise MissingArtifactError(
            f"COS build {build_id} publishes no {requested.alias!r} driver version: "
            f"{name} not found at {url}",
            hint=(
                "pick an explicit --driver-version, or an alias this build offers "
                "(default, latest, R<branch>); check --cos-artifacts-url (COS_DOWNLOAD_GCS) "
                "if no alias resolves"
            ),
            url=url,
            build_id=build_id,
            alias=requested.alias,
        )
    lines = [ln.strip() for ln in text.splitlines() if ln.strip() and not ln.startswith("#")]
    version = lines[0] if lines else ""
    if not is_driver_version(version):
        raise IntegrityError(
            f"{name} of COS build {build_id} does not hold a driver version: {text[:80]!r}",
            hint="the artifact is corrupt, or the URL does not serve COS artifacts",
            url=url,
            build_id=build_id,
            alias=requested.alias,
        )
    log.info("driver_version_resolved", alias=requested.alias, version=version, url=url)
    return Resolved(version, requested.raw, requested.alias, url)


# --------------------------------------------------------------------------- toolchain


def parse_toolchain_env(text: str | None, source: str = TOOLCHAIN_ENV_FILE) -> dict[str, str]:
    """``toolchain_env`` (``CC=…``/``CXX=…`` shell lines); defaults when the build has none.

    Only the toolchain's own tools may be named (:func:`toolchain.check_toolchain_env`):
    anything else is exit 6 here, before a value reaches a build.
    """
    if text is None:
        return dict(DEFAULT_TOOLCHAIN_ENV)
    env = parse_env_file(text)
    check_toolchain_env(env, source)
    return {**DEFAULT_TOOLCHAIN_ENV, **{k: v for k, v in env.items() if v}}


def toolchain_location(text: str | None, base: str, root: str | None = None) -> str:
    """Where the toolchain archive is: ``toolchain_url``'s content, else ``toolchain.tar.xz``.

    ``toolchain_url`` holds one location, checked by :func:`installer.net.policy.from_metadata`
    (remote metadata: relative inside the artifacts, or https on their origin;
    ``gs://bucket/obj`` is read over HTTPS).
    """
    if text is None:
        return join(base, TOOLCHAIN_ARCHIVE)
    lines = [ln.strip() for ln in text.splitlines() if ln.strip() and not ln.startswith("#")]
    source = join(base, TOOLCHAIN_URL_FILE)
    if not lines:
        raise IntegrityError(f"{TOOLCHAIN_URL_FILE} at {source} is empty", url=source)
    return from_metadata(lines[0], base, root=root, what="toolchain", source=source)


# --------------------------------------------------------------------------- access


class Artifacts:
    """The artifacts of one build, read over HTTP(S) or from ``file://``."""

    def __init__(self, base: str, build_id: str, board: str | None, session: ArtifactSession | None,
                 *, policy: RetryPolicy | None = None, manifest: Manifest | None = None) -> None:
        # Imported here: the session module imports requests, which a run that fetches
        # nothing (a cache hit, every boot) must not load (installer/net/__init__.py).
        from installer.net.session import or_default

        session = or_default(session)
        session.url_policy.check(base + "/")
        self.base = base
        self.build_id = build_id
        self.board = board
        self.session = session
        self.policy = policy
        self.manifest = manifest

    def url(self, name: str) -> str:
        return join(self.base, name)

    def fetch_text(self, name: str) -> str | None:
        """A small metadata file of the build (None: the build has none).

        With a manifest only what it lists is read (and must match); an unlisted file
        is probed, not read: absent is fine (most builds have no ``toolchain_url``),
        present is exit 6, since its content would steer the install unvetted.
        """
        if self.manifest is not None and self.manifest.lookup(name) is None:
            if self.exists(name):
                raise self.manifest.not_listed(self.url(name), name)
            return None
        text = fetch_text(self.session, self.url(name), policy=self.policy)
        if self.manifest is not None:
            self.manifest.check_text(name, text, self.url(name))
        return text

    def pin(self, url: str, label: str) -> str | None:
        """The sha256 an artifact must have: from the manifest, which must list it (None
        without a manifest)."""
        return self.manifest.require(url, label) if self.manifest is not None else None

    def exists(self, name: str) -> bool:
        return url_exists(self.session, self.url(name), policy=self.policy)

    def resolve(self, requested: Requested) -> Resolved:
        return resolve_version(requested, self.fetch_text, base=self.base, build_id=self.build_id)

