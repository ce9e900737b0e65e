#!/usr/bin/env bash
# Push the images images/build.sh built (`make images`) to a registry, each flavour as one
# manifest list over its architectures (amd64, arm64: `buildah manifest push --all`), and
# print the lists' digests to pin them by (`manifests render --image-digest`): a node pulls
# its own architecture's image through the list, so one DaemonSet serves both.
#
# Usage: images/push.sh REGISTRY [TAG] [FLAVOR...]
#   REGISTRY  where the images go: REGISTRY/nvidia-driver-installer-<flavor>:TAG
#             (e.g. europe-docker.pkg.dev/PROJECT/REPO, ghcr.io/ORG)
#   TAG       the tag pushed (default: the built one, the package version)
# Environment: as images/build.sh (NDI_LOCAL_BASE, NDI_IMAGE_CACHE, NDI_BUILDAH_ROOT,
# NDI_BUILDAH_RUNROOT, NDI_IMAGE_TAG), and
#   NDI_PUSH_TLS_VERIFY  false for a plain-http registry on this machine (true)
#   NDI_PUSH_AUTHFILE    registry credentials (buildah login's auth.json; default: buildah's)
#
# stdout: one line per image, "<flavor> <reference>@<digest of the list>", then the render
# command pinning them; stderr names the architectures each list holds. Credentials never
# appear: buildah reads them from the auth file.
set -euo pipefail

# shellcheck source-path=SCRIPTDIR source=common.sh
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

log() { printf '[push] %s\n' "$*" >&2; }
die() { printf '[push] error: %s\n' "$*" >&2; exit 2; }

[[ $# -ge 1 && -n ${1:-} ]] || die "usage: images/push.sh REGISTRY [TAG] [FLAVOR...] (make push REGISTRY=... [TAG=...])"
REGISTRY=${1%/}
TAG=${2:-$BUILT_TAG}
shift $(($# >= 2 ? 2 : 1))
FLAVORS=("$@")
((${#FLAVORS[@]})) || FLAVORS=(cos ubuntu)
# A registry path as image references allow it (host[:port]/path, lower case), and a tag.
[[ $REGISTRY =~ ^[a-z0-9.-]+(:[0-9]+)?(/[a-z0-9._-]+)*$ ]] ||
  die "REGISTRY '$REGISTRY' is not a registry path like registry.example.com/team (lower case, no scheme)"
[[ $TAG =~ ^[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}$ ]] || die "TAG '$TAG' is not an image tag"
command -v buildah >/dev/null || die "buildah is not installed (apt-get install buildah)"

args=(--tls-verify="${NDI_PUSH_TLS_VERIFY:-true}")
[[ -z ${NDI_PUSH_AUTHFILE:-} ]] || args+=(--authfile "$NDI_PUSH_AUTHFILE")
built_in() {  # built_in STORAGE: every flavour's manifest list is there
  local flavor
  for flavor in "${FLAVORS[@]}"; do
    buildah --root "$1" --runroot "$RUNROOT" manifest inspect "$(list_ref "$flavor")" >/dev/null 2>&1 || return 1
  done
}
# `make images` and `NDI_LOCAL_BASE=1 make images` build into different storages: push
# from the one that holds the images, not only the one this run's NDI_LOCAL_BASE names.
if [[ -z ${NDI_BUILDAH_ROOT:-} && $LOCAL_BASE != 1 ]] && ! built_in "$REAL_STORAGE" &&
    built_in "$SUBSTITUTE_STORAGE"; then
  LOCAL_BASE=1
  STORAGE_ROOT=$SUBSTITUTE_STORAGE
fi
if [[ $LOCAL_BASE == 1 ]]; then
  log "WARNING: these images were built FROM the local debootstrap substitute base" \
      "(NDI_LOCAL_BASE=1), not the real bases: for tests, not for nodes"
fi

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
pins=()
for flavor in "${FLAVORS[@]}"; do
  src=$(list_ref "$flavor")
  dest=$REGISTRY/nvidia-driver-installer-$flavor:$TAG
  list=$(bah manifest inspect "$src" 2>/dev/null) ||
    die "no manifest list $src in $STORAGE_ROOT: run make images first (TAG names the pushed tag, not the built one: NDI_IMAGE_TAG picks which built images)"
  log "pushing $src ($(python3 -c 'import json,sys; print(", ".join(m["platform"]["architecture"] for m in json.load(sys.stdin)["manifests"]))' <<<"$list")) to $dest ..."
  # --all: every architecture's image with the list (without it only the list goes);
  # --format oci: an OCI index over the OCI image manifests buildah commits (the local
  # list is a Docker manifest list: one media type family, whatever the source).
  bah manifest push -q --all --format oci "${args[@]}" --digestfile "$work/$flavor" "$src" "docker://$dest" >/dev/null
  digest=$(<"$work/$flavor")
  [[ $digest =~ ^sha256:[a-f0-9]{64}$ ]] || die "buildah manifest push wrote no digest for $dest"
  printf '%s %s@%s\n' "$flavor" "$dest" "$digest"
  pins+=(--image-digest "$flavor=$digest")
done
flavor_args=()
for flavor in "${FLAVORS[@]}"; do flavor_args+=(--flavor "$flavor"); done
# REGISTRY and TAG were checked above: nothing in them needs more than single quotes.
printf "nvidia-driver-installer manifests render %s --image '%s' %s\n" "${flavor_args[*]}" \
  "$REGISTRY/nvidia-driver-installer-{flavor}:$TAG" "${pins[*]}"
