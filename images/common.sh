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
# The architectures built (Debian's names: amd64 arm64), one image each per flavour,
# and one manifest list per flavour over them (images/build.sh, images/push.sh).
read -ra ARCHES <<<"${NDI_IMAGE_ARCHES:-amd64 arm64}"
HOST_ARCH=$(dpkg --print-architecture 2>/dev/null || echo amd64)
# The plain tag names the image a `podman run` here would pick: the host's architecture.
built_ref() { printf 'localhost/nvidia-driver-installer-%s:%s' "$1" "$BUILT_TAG"; }
arch_ref() { printf 'localhost/nvidia-driver-installer-%s:%s-%s' "$1" "$BUILT_TAG" "$2"; }
list_ref() { printf 'localhost/nvidia-driver-installer-%s:%s-list' "$1" "$BUILT_TAG"; }
