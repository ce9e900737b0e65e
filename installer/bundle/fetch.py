"""``install --prebuilt-url``: a prebuilt bundle instead of compiling, checked to the last byte.

One plan step, ``fetch_prebuilt_bundle``, put before the flow's build steps
(:func:`prebuilt_step`). It expands the URL template for this node's driver,
kernel and module type, takes the bundle's sha256 from ``--prebuilt-sha256``
or the ``index.json`` beside the bundles, downloads it (the digest checked
while streaming), extracts it with the bounded extractor, and checks that the
extracted tree is exactly what the manifest lists, that the manifest is for
this driver, kernel and module type, and that every module's vermagic names the
running kernel. The staged tree is then what a build would have left: the
usual load / verify / promote / record-cache steps take over, and the build
steps are skipped.

Outcomes: a missing bundle (HTTP 404, no such file) falls back to the build
steps, or with ``--prebuilt-only`` is exit 5 naming it; a bundle that is not
pinned, fails its digest, lies in its manifest or is for another kernel is
exit 6 and never falls back; an unsigned bundle on a kernel that enforces
signatures is exit 10.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING

import structlog

from installer import archive, signing
from installer.bundle import index, tree
from installer.bundle.manifest import (
    INDEX_NAME,
    MANIFEST_NAME,
    BundleError,
    BundleKey,
    Manifest,
    expand_url,
    index_url,
)
from installer.errors import DownloadError, IntegrityError, UsageError
from installer.fsutil import remove_tree
from installer.installdir import LAYOUT_DIRS, Tree
from installer.modinfo import read_modinfo, vermagic_release
from installer.net.fetch import fetch_text
from installer.net.policy import redact_url
from installer.net.transfer import download
from installer.plan import Step

if TYPE_CHECKING:
    from installer.context import Context

log = structlog.get_logger(__name__)

MAX_BUNDLE_BYTES = 16 << 30  # unpacked; a 535 bundle is ~0.4 GB


def prebuilt_step(ctx: Context, version: str, module_type: str) -> Step:
    """The plan's bundle step (the distro's build runs only if it found no bundle)."""
    try:
        key = BundleKey(version, ctx.host_info.kernel_release, module_type)
    except BundleError as exc:
        raise UsageError(f"no bundle can exist for this node: {exc}") from None
    return fetch_prebuilt(key, expand_url(ctx.settings.prebuilt_url or "", key))


def fetch_prebuilt(key: BundleKey, url: str) -> Step:
    def run(ctx: Context) -> None:
        # As the build path does before its big download: an in-use other driver is exit 8.
        staging = ctx.work.staged()
        digest = ctx.settings.prebuilt_sha256 or _digest_from_index(ctx, url, key)
        path = _download(ctx, url, key, digest, staging)
        if path is None:
            return
        if digest is None:
            raise IntegrityError(
                f"prebuilt bundle {key.name()} is not pinned: no entry in {INDEX_NAME} beside "
                "it and no --prebuilt-sha256",
                hint=f"run `nvidia-driver-installer bundle index` where the bundles are and "
                f"publish {INDEX_NAME}, or pass --prebuilt-sha256", url=redact_url(url))
        manifest = unpack(path, staging, key, ctx.kernel.release())
        policy = signing.policy(ctx.kernel)
        if policy.enforced and not manifest.signed:
            raise signing.refusal(
                policy, f"bundle {key.name()} is unsigned",
                "build the bundles with --signing-key/--signing-cert of a key enrolled on the "
                "nodes", kernel_release=key.kernel_release)
        ctx.work.bundle = manifest
        log.info("prebuilt_bundle_staged", bundle=key.name(), url=redact_url(url),
                 vermagic=manifest.vermagic, compiler=manifest.compiler, signed=manifest.signed)

    return Step("fetch_prebuilt_bundle", run,
                f"{redact_url(url)}, sha256 from --prebuilt-sha256 or {INDEX_NAME}; "
                "else build")


def _digest_from_index(ctx: Context, url: str, key: BundleKey) -> str | None:
    where = index_url(url)
    text = fetch_text(ctx.http, where, allow_insecure_http=ctx.settings.allow_insecure_http,
                      max_bytes=index.MAX_INDEX_BYTES)
    if text is None:
        log.info("prebuilt_index_missing", url=redact_url(where))
        return None
    try:
        entry = index.parse(text).get(key.name())
    except BundleError as exc:
        raise IntegrityError(f"the bundle index {redact_url(where)} is unusable: {exc}",
                             hint="re-run `nvidia-driver-installer bundle index` and publish "
                             "it again", url=redact_url(where)) from None
    return entry.sha256 if entry else None


def _download(ctx: Context, url: str, key: BundleKey, digest: str | None,
              staging: Tree) -> Path | None:
    """The verified bundle file, or None when there is no such bundle (after the fallback
    or --prebuilt-only decision)."""
    try:
        return download(ctx.http, url, staging.root / "downloads" / key.name(),
                        expected_sha256=digest, label="prebuilt bundle",
                        allow_insecure_http=ctx.settings.allow_insecure_http).path
    except DownloadError as exc:
        if exc.context.get("status") != 404:  # HTTP 404, or a missing file:// path
            raise
    if ctx.settings.prebuilt_only:
        raise DownloadError(
            f"no prebuilt bundle {key.name()} at {redact_url(url)} (--prebuilt-only)",
            hint="build it (`nvidia-driver-installer bundle build`, or the bundle Job) and "
            "publish it with `bundle index`, or drop --prebuilt-only to compile on the node",
            url=redact_url(url))
    log.warning("prebuilt_bundle_missing", bundle=key.name(), url=redact_url(url),
                fallback="compiling on this node")
    return None


def unpack(path: Path, staging: Tree, key: BundleKey, running_release: str) -> Manifest:
    """Check the manifest (the archive's first member) against this node, extract, check
    the tree against the manifest, then move the layout dirs into ``staging``.

    The manifest is read before anything is extracted, so a bundle for another
    driver, kernel or module type costs one small read, not unpacking ~0.2 GB."""
    def refuse(what: str) -> IntegrityError:
        return IntegrityError(f"prebuilt bundle {key.name()} {what}; nothing was installed",
                              hint="rebuild and re-index the bundle; do not edit bundles",
                              path=str(path), kernel_release=running_release)

    try:
        manifest = index.read_manifest(path)
    except BundleError as exc:
        raise refuse(f"has a bad manifest: {exc}") from None
    if manifest.key != key:
        raise refuse(f"holds {manifest.key.describe()}, not {key.describe()}")
    out = staging.root / "bundle"
    archive.extract(path, out, label=key.name(), max_bytes=MAX_BUNDLE_BYTES)
    path.unlink()  # the tree is what is checked from here on; free its space now
    extra = sorted({p.name for p in out.iterdir()} - {*LAYOUT_DIRS, MANIFEST_NAME})
    if extra:
        raise refuse(f"holds {', '.join(extra)} beside the install layout")
    # The digest pinned the archive and so the manifest; this pins the files to it.
    differences = tree.differences(out, manifest.files, manifest.links)
    if differences:
        raise refuse(f"does not match its manifest: {'; '.join(differences[:3])}")
    for ko in sorted((out / "drivers").glob("*.ko")):
        built_for = vermagic_release(read_modinfo(ko))
        if built_for != running_release:
            raise refuse(f"has {ko.name} built for kernel {built_for}, the running kernel is "
                         f"{running_release}")
    for top in LAYOUT_DIRS:
        if (out / top).is_dir():
            os.replace(out / top, staging.root / top)  # onto the empty dir new_staging made
    remove_tree(out)
    return manifest
