"""``install --prebuilt-url``: a prebuilt bundle instead of compiling, checked to the last byte.

One plan step, ``fetch_prebuilt_bundle``, put before the flow's build steps
(:func:`prebuilt_step`). It expands the URL template for this node's driver,
kernel and module type, takes the bundle's sha256 from ``--prebuilt-sha256``
or the ``index.json`` beside the bundles, and downloads it, hashing the
compressed bytes as they come: nothing is decompressed before they match
(the digest may come from an index on the same mirror, but a mismatch then
costs only the download). Then the bounded extractor (zstd or gzip) reads the
manifest (the first member), which must be for this driver, kernel and module
type before anything else is extracted, and writes no more than the sizes it
declares; then the extracted tree must be exactly what the manifest lists and
every module's vermagic must name the running kernel -- only then is anything
moved into the staging layout. The staged tree is then what a build would have
left: the usual load / verify / promote / record-cache steps take over (the
``.cache`` record takes the manifest's verified hashes), and the build steps
are skipped.

Outcomes: a missing bundle (HTTP 404, no such file) falls back to the build
steps, or with ``--prebuilt-only`` is exit 5 naming it; a bundle that is not
pinned, fails its digest, lies in its manifest or is for another kernel is
exit 6 and never falls back (so is one for another CPU architecture: its
manifest's ``arch`` and every module's ELF machine must be the node's); an
unsigned bundle on a kernel that enforces signatures is exit 10.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, BinaryIO
from urllib.parse import unquote, urlsplit

import structlog

from installer.base import cpuarch
from installer.base.errors import DownloadError, IntegrityError, UsageError
from installer.base.fsutil import remove_tree
from installer.base.kinds import ModuleType
from installer.bundle import index, tree
from installer.host.installdir import LAYOUT_DIRS, Tree
from installer.jail import archive
from installer.kmod import signing
from installer.kmod.modinfo import read_modinfo, vermagic_release
from installer.net.fetch import fetch_text
from installer.net.policy import redact_url
from installer.net.transfer import stream
from installer.plan import Step
from installer.records.bundle_manifest import (
    DEFAULT_ARCH,
    INDEX_NAME,
    MANIFEST_NAME,
    MAX_MANIFEST_BYTES,
    SUFFIXES,
    BundleError,
    BundleKey,
    Manifest,
    expand_url,
    index_url,
)
from installer.records.results import BundleStaged, Staged

if TYPE_CHECKING:
    from installer.context import Context

log = structlog.get_logger(__name__)

MAX_BUNDLE_BYTES = 16 << 30  # unpacked; a 535 bundle is ~0.4 GB; its manifest bounds it
COPY_CHUNK = 1 << 20


def prebuilt_step(ctx: Context, version: str, module_type: ModuleType) -> Step:
    """The plan's bundle step (the distro's build runs only if it found no bundle)."""
    try:
        key = BundleKey(version, ctx.host_info.kernel_release, module_type)
    except BundleError as exc:
        raise UsageError(f"no bundle can exist for this node: {exc}") from None
    return fetch_prebuilt(key, ctx.settings.prebuilt_url or "")


def fetch_prebuilt(key: BundleKey, template: str) -> Step:
    url = expand_url(template, key)

    def run(ctx: Context) -> BundleStaged | None:
        # As the build path does before its big download: an in-use other driver is exit 8.
        staging = ctx.results.staging()
        manifest = None
        for where, digest in _candidates(ctx, template, key):
            manifest = _stream_bundle(ctx, where, key, digest, staging)
            if manifest is not None:
                break
        if manifest is None:
            _missing(ctx, key, url)
            return None
        policy = signing.policy(ctx.kernel)
        if policy.enforced and not manifest.signed:
            raise signing.refusal(
                policy, f"bundle {key.name()} is unsigned",
                "build the bundles with --signing-key/--signing-cert of a key enrolled on the "
                "nodes", kernel_release=key.kernel_release)
        log.info("prebuilt_bundle_staged", bundle=key.name(), url=redact_url(where),
                 vermagic=manifest.vermagic, compiler=manifest.compiler, signed=manifest.signed)
        return BundleStaged(manifest)

    return Step("fetch_prebuilt_bundle", run,
                f"{redact_url(url)}, sha256 from --prebuilt-sha256 or {INDEX_NAME}; "
                "else build", needs=(Staged,), gives=(BundleStaged,))


def _candidates(ctx: Context, template: str, key: BundleKey) -> list[tuple[str, str | None]]:
    """(URL, pinned sha256 or None) to try in turn, the first one found wins.

    A directory (``.../``) holds the bundle as ``.tar.zst`` or ``.tar.gz``: the index
    says which (zst preferred); without an entry both names are tried."""
    pinned = ctx.settings.prebuilt_sha256
    if not template.endswith("/"):
        url = expand_url(template, key)
        if pinned:
            return [(url, pinned)]
        # An index lists bundles by their standard names: the URL's own if it is one.
        base = unquote(urlsplit(url).path.rsplit("/", 1)[-1])
        names = [base] if _is_bundle_name(base) else list(key.names())
        entries = _index_entries(ctx, url)
        return [(url, next((entries[n].sha256 for n in names if n in entries), None))]
    urls = {key.name(suffix): expand_url(template, key, suffix) for suffix in SUFFIXES}
    if pinned:
        return [(url, pinned) for url in urls.values()]
    entries = _index_entries(ctx, template)
    found: list[tuple[str, str | None]] = [
        (url, entries[name].sha256) for name, url in urls.items() if name in entries]
    return found[:1] or [(url, None) for url in urls.values()]


def _is_bundle_name(name: str) -> bool:
    try:
        BundleKey.from_name(name)
    except BundleError:
        return False
    return True


def _index_entries(ctx: Context, url: str) -> dict[str, index.IndexEntry]:
    where = index_url(url)
    text = fetch_text(ctx.http, where, max_bytes=index.MAX_INDEX_BYTES)
    if text is None:
        log.info("prebuilt_index_missing", url=redact_url(where))
        return {}
    try:
        return index.parse(text)
    except BundleError as exc:
        raise IntegrityError(f"the bundle index {redact_url(where)} is unusable: {exc}",
                             hint="re-run `nvidia-driver-installer bundle index` and publish "
                             "it again", url=redact_url(where)) from None


def _missing(ctx: Context, key: BundleKey, url: str) -> None:
    """No such bundle: --prebuilt-only's exit 5, else the build steps run."""
    if ctx.settings.prebuilt_only:
        raise DownloadError(
            f"no prebuilt bundle {key.name()} at {redact_url(url)} (--prebuilt-only)",
            hint="build it (`nvidia-driver-installer bundle build`, or the bundle Job) and "
            "publish it with `bundle index`, or drop --prebuilt-only to compile on the node",
            url=redact_url(url))
    log.warning("prebuilt_bundle_missing", bundle=key.name(), url=redact_url(url),
                fallback="compiling on this node")


def _stream_bundle(ctx: Context, url: str, key: BundleKey, digest: str | None,
                   staging: Tree) -> Manifest | None:
    """The bundle at ``url`` downloaded, its digest checked, then extracted, checked and
    staged; None when there is no such bundle (HTTP 404, no such file).

    Nothing is decompressed before the whole compressed body has matched ``digest`` (a
    mismatch costs the download, never a decompression bomb's disk and CPU), and no more
    is then written than the manifest declares. An unpinned bundle is refused at its
    first bytes."""
    out = staging.root / "bundle"
    spool = staging.root / "downloads" / "prebuilt-bundle"
    spool.parent.mkdir(parents=True, exist_ok=True)
    refuse = _refuser(key, url, ctx.kernel.release())

    def consume(body: BinaryIO) -> None:
        if digest is None:
            raise IntegrityError(
                f"prebuilt bundle {key.name()} is not pinned: no entry in {INDEX_NAME} beside "
                "it and no --prebuilt-sha256",
                hint=f"run `nvidia-driver-installer bundle index` where the bundles are and "
                f"publish {INDEX_NAME}, or pass --prebuilt-sha256", url=redact_url(url))
        with open(spool, "wb") as f:  # the transfer hashes what it hands us
            shutil.copyfileobj(body, f, COPY_CHUNK)

    try:
        try:
            stream(ctx.http, url, consume, dest=spool,
                   discard=lambda: spool.unlink(missing_ok=True), expected_sha256=digest,
                   label="prebuilt bundle")
        except DownloadError as exc:
            if exc.context.get("status") != 404:  # HTTP 404, or a missing file:// path
                raise
            return None
        manifest, extracted = extract(spool, out, key, refuse, arch=ctx.arch.machine)
        stage(out, staging, manifest, extracted, ctx.kernel.release(), refuse)
    finally:
        spool.unlink(missing_ok=True)
        remove_tree(out, ignore_errors=True)
    return manifest


def _refuser(key: BundleKey, where: str, running_release: str) -> Callable[[str], IntegrityError]:
    def refuse(what: str) -> IntegrityError:
        return IntegrityError(f"prebuilt bundle {key.name()} {what}; nothing was installed",
                              hint="rebuild and re-index the bundle; do not edit bundles",
                              path=redact_url(where), kernel_release=running_release)

    return refuse


def extract(source: Path | BinaryIO, out: Path, key: BundleKey,
            refuse: Callable[[str], IntegrityError], *, arch: str = DEFAULT_ARCH,
            ) -> tuple[Manifest, archive.ExtractResult]:
    """Extract a bundle (a file or a stream, zstd or gzip) into ``out``; its manifest (the
    first member) is checked against ``key`` and the node's ``arch`` (``uname -m``) before
    anything else is extracted, so a bundle for another driver, kernel, module type or
    architecture costs one small read."""
    seen: list[Manifest] = []

    def check(data: bytes) -> int:
        try:
            manifest = Manifest.from_json(data)
        except BundleError as exc:
            raise refuse(f"has a bad manifest: {exc}") from None
        if manifest.key != key:
            raise refuse(f"holds {manifest.key.describe()}, not {key.describe()}")
        if manifest.arch != arch:
            raise refuse(f"is built for {manifest.arch}, this node is {arch}")
        seen.append(manifest)
        return sum(entry.size for entry in manifest.files.values())  # no more is written

    result = archive.extract(source, out, label=key.name(), max_bytes=MAX_BUNDLE_BYTES,
                             head=archive.Head(MANIFEST_NAME, MAX_MANIFEST_BYTES, check))
    return seen[0], result


def stage(out: Path, staging: Tree, manifest: Manifest, extracted: archive.ExtractResult,
          running_release: str, refuse: Callable[[str], IntegrityError]) -> None:
    """Check the extracted tree against the manifest and the running kernel, then move
    its layout dirs into ``staging``."""
    extra = sorted({p.name for p in out.iterdir()} - set(LAYOUT_DIRS))
    if extra:
        raise refuse(f"holds {', '.join(extra)} beside the install layout")
    # The digest pinned the archive and so the manifest; this pins the files to it (with
    # the hashes the extractor computed as it wrote them: the tree is not read again).
    differences = tree.differences(out, manifest.files, manifest.links, extracted.hashes)
    if differences:
        raise refuse(f"does not match its manifest: {'; '.join(differences[:3])}")
    for ko in sorted((out / "drivers").glob("*.ko")):
        machine = _elf_machine(ko)  # the objects themselves, not only the manifest's word
        if machine != manifest.arch:
            raise refuse(f"has {ko.name} built for {machine or 'no known machine'}, its "
                         f"manifest says {manifest.arch}")
        built_for = vermagic_release(read_modinfo(ko))
        if built_for != running_release:
            raise refuse(f"has {ko.name} built for kernel {built_for}, the running kernel is "
                         f"{running_release}")
    for top in LAYOUT_DIRS:
        if (out / top).is_dir():
            os.replace(out / top, staging.root / top)  # onto the empty dir new_staging made


def _elf_machine(path: Path) -> str | None:
    with open(path, "rb") as f:
        found = cpuarch.elf_arch(f.read(cpuarch.ELF_HEAD_BYTES))
    return found.machine if found else None


def unpack(path: Path, staging: Tree, key: BundleKey, running_release: str, *,
           arch: str = DEFAULT_ARCH) -> Manifest:
    """A bundle file already verified (tests, a pre-staged copy): extract, check, stage."""
    out = staging.root / "bundle"
    refuse = _refuser(key, str(path), running_release)
    try:
        manifest, extracted = extract(path, out, key, refuse, arch=arch)
        stage(out, staging, manifest, extracted, running_release, refuse)
    finally:
        remove_tree(out, ignore_errors=True)
    return manifest
