"""A bundle's name, its manifest and the URL template that finds it. Pure.

A bundle is ``nvidia-driver-<driver>-<module type>-<kernel release>.tar.zst``
(``.tar.gz`` for bundles built before zstd: still read, the compression told by
the archive's magic bytes) holding ``manifest.json`` (first member) and the install layout: ``drivers/``,
``bin/``, ``lib64/``, ``firmware/``. The manifest names the keys (driver
version, kernel release, module type), the CPU architecture, the modules' vermagic, the compiler,
whether the modules are signed, and the sha256 and size of every file and the
target of every symlink.

Everything here is read as hostile input (a bundle server is one more party
that could send anything): sizes and counts are bounded, every path is a clean
relative path inside a layout dir, every link stays inside the bundle, and
``BundleError`` names the first thing wrong.
"""

from __future__ import annotations

import json
import posixpath
import re
import string
from dataclasses import field
from pathlib import Path
from typing import cast
from urllib.parse import quote, urlsplit, urlunsplit

from installer.base import cpuarch, safejson
from installer.base.branches import EXAMPLE_VERSION
from installer.base.dataclass import dataclass
from installer.base.kinds import MODULE_TYPES, ModuleType
from installer.base.values import is_driver_version, is_kernel_release, sha256_digest
from installer.host.installdir import check_layout_path

FORMAT = 1
MANIFEST_NAME = "manifest.json"
INDEX_NAME = "index.json"
SUFFIX = ".tar.zst"  # what bundle build writes
SUFFIXES = (SUFFIX, ".tar.gz")  # what nodes and bundle index read, preferred first
MAX_MANIFEST_BYTES = 4 << 20  # a real 535 bundle's manifest: ~15 KB
MAX_FILES = 20_000
MAX_FILE_BYTES = 4 << 30
MAX_TEXT = 512
PLACEHOLDERS = ("driver_version", "kernel_release", "module_type")
ARCH_NAMES = tuple(a.machine for a in cpuarch.ARCHES)
# A manifest without "arch" was written before arm64 bundles (issue 42): x86_64, the only
# architecture the installer built for then.
DEFAULT_ARCH = cpuarch.X86_64.machine

_NAME = re.compile(r"^nvidia-driver-(\d[\d.]*\d)-(open|proprietary)-(.+)\.tar\.(?:zst|gz)$")


class BundleError(ValueError):
    """A name, manifest, index or template that is not what it must be (one line)."""


def check_sha256(value: object, what: str) -> str:
    digest = sha256_digest(value) if isinstance(value, str) else None
    if digest is None:
        raise BundleError(f"{what} is not 64 hex digits (optionally prefixed 'sha256:')")
    return digest


def _text(value: object, what: str, limit: int = MAX_TEXT) -> str:
    if not isinstance(value, str) or len(value) > limit or not value.isprintable():
        raise BundleError(f"{what} is not a printable string of at most {limit} characters")
    return value


@dataclass(frozen=True)
class BundleKey:
    """What a bundle is for: one driver, one kernel, one module type."""

    driver_version: str
    kernel_release: str
    module_type: ModuleType

    def __post_init__(self) -> None:
        if not is_driver_version(self.driver_version):
            raise BundleError(f"driver version {self.driver_version!r} is not like "
                              f"{EXAMPLE_VERSION}")
        if not is_kernel_release(self.kernel_release):
            raise BundleError(f"kernel release {self.kernel_release!r} is not a uname -r value")
        if self.module_type not in MODULE_TYPES:
            raise BundleError(f"module type {self.module_type!r} is not open or proprietary")

    @classmethod
    def of(cls, driver_version: str, kernel_release: str, module_type: str) -> BundleKey:
        """A key from text (a bundle name, a manifest, a flag): the checks above refuse a
        module type that is not one (BundleError), hence the cast."""
        return cls(driver_version, kernel_release, cast(ModuleType, module_type))

    def name(self, suffix: str = SUFFIX) -> str:
        return (f"nvidia-driver-{self.driver_version}-{self.module_type}-"
                f"{self.kernel_release}{suffix}")

    def names(self) -> tuple[str, ...]:
        """Its name with each suffix a node reads, preferred first."""
        return tuple(self.name(suffix) for suffix in SUFFIXES)

    def describe(self) -> str:
        return f"driver {self.driver_version} ({self.module_type}) for kernel {self.kernel_release}"

    @classmethod
    def from_name(cls, name: str) -> BundleKey:
        match = _NAME.match(name)
        if not match:
            raise BundleError(f"{name!r} is not a bundle name "
                              "(nvidia-driver-<driver>-<module type>-<kernel release>.tar.zst or .tar.gz)")
        version, module_type, release = match.groups()
        return cls.of(version, release, module_type)


def check_rel(rel: object, what: str = "path") -> str:
    """A clean relative path inside one of the layout dirs (never the dir itself)."""
    try:
        return check_layout_path(rel, what)
    except ValueError as exc:
        raise BundleError(str(exc)) from None


def check_link(rel: str, target: object) -> str:
    """A symlink's target: relative, and pointing inside the bundle's layout dirs."""
    if not isinstance(target, str) or not target or target.startswith("/"):
        raise BundleError(f"link {rel!r} -> {target!r} is not a relative link")
    check_rel(posixpath.normpath(posixpath.join(posixpath.dirname(rel), target)),
              f"target of link {rel!r}")
    return target


@dataclass(frozen=True)
class FileEntry:
    sha256: str
    size: int


@dataclass(frozen=True)
class Manifest:
    key: BundleKey
    vermagic: str  # of nvidia.ko: "<release> SMP mod_unload modversions"
    compiler: str  # the compiler that built the modules (its --version line)
    signed: bool
    built_at: str
    installer_version: str
    driver_sha256: str | None  # of the .run the bundle was built from
    files: dict[str, FileEntry] = field(default_factory=dict)
    links: dict[str, str] = field(default_factory=dict)
    # The CPU architecture the modules and binaries are for (``uname -m``): the name does
    # not say it (Ubuntu's 6.8.0-1015-gcp is the same release on x86_64 and arm64).
    arch: str = DEFAULT_ARCH

    def summary(self) -> dict[str, object]:
        """What the index keeps about a bundle besides its digest."""
        return {"driver_version": self.key.driver_version,
                "kernel_release": self.key.kernel_release,
                "module_type": self.key.module_type, "arch": self.arch,
                "vermagic": self.vermagic,
                "compiler": self.compiler, "signed": self.signed, "built_at": self.built_at}

    def to_json(self) -> str:
        doc = {"format": FORMAT, **self.summary(), "installer_version": self.installer_version,
               "driver_sha256": self.driver_sha256,
               "files": {rel: {"sha256": e.sha256, "size": e.size}
                         for rel, e in sorted(self.files.items())},
               "links": dict(sorted(self.links.items()))}
        return json.dumps(doc, indent=1) + "\n"

    @classmethod
    def from_json(cls, data: bytes) -> Manifest:
        try:
            doc = safejson.loads(data, max_bytes=MAX_MANIFEST_BYTES)
        except ValueError as exc:
            raise BundleError(f"the manifest {exc}") from None
        if not isinstance(doc, dict) or doc.get("format") != FORMAT:
            raise BundleError(f"the manifest is not a format-{FORMAT} bundle manifest")
        key = BundleKey.of(_text(doc.get("driver_version"), "driver_version"),
                        _text(doc.get("kernel_release"), "kernel_release"),
                        _text(doc.get("module_type"), "module_type"))
        vermagic = _text(doc.get("vermagic"), "vermagic")
        if vermagic.split()[:1] != [key.kernel_release]:
            raise BundleError(f"vermagic {vermagic!r} is not for kernel {key.kernel_release}")
        files, links = doc.get("files"), doc.get("links")
        if not isinstance(files, dict) or not isinstance(links, dict):
            raise BundleError("the manifest's files and links are not objects")
        if len(files) + len(links) > MAX_FILES:
            raise BundleError(f"the manifest lists more than {MAX_FILES} files")
        entries = {}
        for rel, entry in files.items():
            check_rel(rel)
            if not isinstance(entry, dict):
                raise BundleError(f"the entry of {rel!r} is not an object")
            size = entry.get("size")
            if type(size) is not int or not 0 <= size <= MAX_FILE_BYTES:
                raise BundleError(f"the size of {rel!r} is not an integer in 0..{MAX_FILE_BYTES}")
            entries[rel] = FileEntry(check_sha256(entry.get("sha256"), f"the sha256 of {rel!r}"),
                                     size)
        for rel, target in links.items():
            check_link(check_rel(rel), target)
            if rel in entries:
                raise BundleError(f"{rel!r} is listed as a file and as a link")
        if "drivers/nvidia.ko" not in entries:
            raise BundleError("the manifest lists no drivers/nvidia.ko")
        signed, sha = doc.get("signed"), doc.get("driver_sha256")
        arch = doc.get("arch", DEFAULT_ARCH)
        if arch not in ARCH_NAMES:
            raise BundleError(f"arch {arch!r} is not one of {', '.join(ARCH_NAMES)}")
        if not isinstance(signed, bool):
            raise BundleError("signed is not true or false")
        return cls(key, vermagic, _text(doc.get("compiler"), "compiler"), signed,
                   _text(doc.get("built_at"), "built_at", 64),
                   _text(doc.get("installer_version"), "installer_version", 64),
                   None if sha is None else check_sha256(sha, "driver_sha256"),
                   entries, dict(links), arch)


def expand_url(template: str, key: BundleKey, suffix: str = SUFFIX) -> str:
    """The bundle URL for ``key``: ``{driver_version}``, ``{kernel_release}`` and
    ``{module_type}`` filled in (URL-quoted); a template ending in ``/`` is a
    directory and gets the bundle's standard name with ``suffix``."""
    if template.endswith("/"):
        template += "{name}"
    values = {"driver_version": key.driver_version, "kernel_release": key.kernel_release,
              "module_type": key.module_type, "name": key.name(suffix)}
    check_template(template, allowed=(*PLACEHOLDERS, "name"))
    return template.format_map({k: quote(v, safe="") for k, v in values.items()})


def check_template(template: str, allowed: tuple[str, ...] = PLACEHOLDERS) -> None:
    try:
        fields = [f for _, f, _spec, _conv in string.Formatter().parse(template) if f is not None]
    except ValueError as exc:
        raise BundleError(f"bad --prebuilt-url template {template!r}: {exc}") from None
    unknown = [f for f in fields if f not in allowed]
    if unknown:
        raise BundleError(f"--prebuilt-url has the unknown placeholder {{{unknown[0]}}}; "
                          f"known: {', '.join('{' + p + '}' for p in PLACEHOLDERS)}")


def index_url(bundle_url: str) -> str:
    """``index.json`` in the bundle's directory (without the bundle's query string:
    a signed URL signs one object)."""
    parts = urlsplit(bundle_url)
    directory = parts.path.rsplit("/", 1)[0]
    return urlunsplit((parts.scheme, parts.netloc, f"{directory}/{INDEX_NAME}", "", ""))


@dataclass(frozen=True)
class Written:
    """A bundle ``bundle build`` wrote: its file, the file's sha256 and its manifest."""

    path: Path
    sha256: str
    manifest: Manifest
