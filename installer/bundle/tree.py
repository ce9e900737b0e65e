"""The files and symlinks of an install layout tree, as a manifest lists them.

One walker for both sides: ``bundle build`` describes the staged tree it packs,
the node describes the tree it extracted and compares (a manifest that lies
about a file's sha256, a file it does not list, a link it does not name: all
differ).
"""

from __future__ import annotations

import os
import stat
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from installer.base.fsutil import sha256_file
from installer.host.installdir import LAYOUT_DIRS
from installer.records.bundle_manifest import MAX_FILES, BundleError, FileEntry


def describe(root: Path, known: Mapping[str, str] | None = None
             ) -> tuple[dict[str, FileEntry], dict[str, str]]:
    """(files: rel -> sha256/size, links: rel -> target) under the layout dirs of ``root``.

    Anything else (a FIFO, a device, a socket) is a BundleError; links are not followed.
    ``known``: sha256s already computed (by the extractor, as it wrote the files); only
    the files not in it are read. Those are hashed on every CPU (hashlib lets go of the
    GIL): ~0.2 GB for a 535 bundle.
    """
    known = known or {}
    sizes: dict[str, int] = {}
    links: dict[str, str] = {}
    for top in LAYOUT_DIRS:
        for dirpath, dirnames, filenames in os.walk(root / top):
            for name in sorted(filenames + [d for d in dirnames if (Path(dirpath) / d).is_symlink()]):
                path = Path(dirpath) / name
                rel = path.relative_to(root).as_posix()
                st = path.lstat()
                if stat.S_ISLNK(st.st_mode):
                    links[rel] = os.readlink(path)
                elif stat.S_ISREG(st.st_mode):
                    sizes[rel] = st.st_size
                else:
                    raise BundleError(f"{rel} is neither a regular file nor a symlink")
                if len(sizes) + len(links) > MAX_FILES:
                    raise BundleError(f"more than {MAX_FILES} files under {root}")
    unknown = [rel for rel in sizes if rel not in known]
    with ThreadPoolExecutor(max_workers=os.cpu_count() or 1) as pool:
        digests = dict(zip(unknown, pool.map(sha256_file, [root / rel for rel in unknown]),
                           strict=True))
    files = {rel: FileEntry(known.get(rel) or digests[rel], size) for rel, size in sizes.items()}
    return files, links


def differences(root: Path, files: dict[str, FileEntry], links: dict[str, str],
                known: Mapping[str, str] | None = None) -> list[str]:
    """How the tree at ``root`` differs from what a manifest lists (empty: identical);
    ``known`` as for describe()."""
    have_files, have_links = describe(root, known)
    out = []
    for rel in sorted(set(files) | set(have_files)):
        want, have = files.get(rel), have_files.get(rel)
        if want is None:
            out.append(f"{rel} is not in the manifest")
        elif have is None:
            out.append(f"{rel} is missing")
        elif have != want:
            out.append(f"{rel} has sha256 {have.sha256} ({have.size} bytes), the manifest says "
                       f"{want.sha256} ({want.size} bytes)")
    for rel in sorted(set(links) | set(have_links)):
        if links.get(rel) != have_links.get(rel):
            out.append(f"link {rel} -> {have_links.get(rel)}, the manifest says {links.get(rel)}")
    return out
