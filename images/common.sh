# Sourced by images/build.sh and images/push.sh: where the images live, and their tag.
# shellcheck shell=bash disable=SC2034  # the variables are for the scripts sourcing this
REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
CACHE=${NDI_IMAGE_CACHE:-/var/cache/ndi-images}
LOCAL_BASE=${NDI_LOCAL_BASE:-0}
# Real and substitute bases carry the same names: never in one storage.
REAL_STORAGE=$CACHE/storage-real
SUBSTITUTE_STORAGE=$CACHE/storage
STORAGE_ROOT=${NDI_BUILDAH_ROOT:-$([[ $LOCAL_BASE == 1 ]] && echo "$SUBSTITUTE_STORAGE" || echo "$REAL_STORAGE")}
RUNROOT=${NDI_BUILDAH_RUNROOT:-/run/ndi-images}
VERSION=$(sed -n 's/^__version__ = "\(.*\)"/\1/p' "$REPO/installer/__init__.py")
# The tag images/build.sh gives what it builds: the package version unless NDI_IMAGE_TAG.
BUILT_TAG=${NDI_IMAGE_TAG:-$(printf '%s' "$VERSION" | tr -c 'A-Za-z0-9_.-' '-')}
bah() { buildah --root "$STORAGE_ROOT" --runroot "$RUNROOT" "$@"; }
