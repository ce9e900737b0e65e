#!/usr/bin/env bash
# Build both installer images with buildah, without a Docker engine, for each
# architecture (amd64 and arm64), and one manifest list per image over them:
#
#   1. the bases, per architecture: by default the real ones each Dockerfile
#      names in its FROM lines (docker.io/library/debian:12-slim for cos,
#      docker.io/library/ubuntu:22.04 for ubuntu), pulled once per architecture
#      (`buildah pull --arch`) into a private buildah storage; the build stops,
#      naming the base, when its registry is unreachable.
#      With NDI_LOCAL_BASE=1 (the test tiers, and machines without that
#      registry) a local Debian bookworm base made with `debootstrap
#      --variant=minbase --arch=<arch>` is tagged under those names instead: a
#      LOCAL SUBSTITUTE, so the Ubuntu image then has a Debian userland (a check
#      of the Dockerfile and the package, not an Ubuntu image to ship);
#   2. `buildah bud --arch <arch> --isolation chroot --pull-never` for images/cos
#      and images/ubuntu. An architecture other than this machine's runs its RUN
#      steps (and the arm64 debootstrap's second stage) under qemu-user-static
#      through binfmt_misc: installed and registered here when missing;
#   3. `buildah manifest create/add`: localhost/nvidia-driver-installer-<flavor>:
#      <tag>-list over the per-architecture images <tag>-amd64 and <tag>-arm64;
#      <tag> alone names this machine's architecture's image (what a local run
#      picks). `make push` (images/push.sh) pushes the lists.
#
# Usage: images/build.sh [FLAVOR...]          (default: cos ubuntu; needs root)
# Environment:
#   NDI_IMAGE_ARCHES    architectures, Debian's names  (amd64 arm64)
#   NDI_LOCAL_BASE      1: the local debootstrap substitute for every base (0)
#   NDI_IMAGE_CACHE     base cache dir               (/var/cache/ndi-images)
#   NDI_BUILDAH_ROOT    buildah storage root         ($NDI_IMAGE_CACHE/storage-real;
#                                                     with NDI_LOCAL_BASE=1 .../storage)
#   NDI_BUILDAH_RUNROOT buildah run root             (/run/ndi-images)
#   NDI_DEBIAN_MIRROR   Debian mirror for debootstrap (default: from apt sources)
#   NDI_BASE_DATE       key the base by this day      (by the suite's Release file)
#   NDI_IMAGE_TAG       image tag                    (the package version)
#   NDI_EXPORT_DIR      also write <dir>/nvidia-driver-installer-<flavor>-<arch>.oci.tar
#
# Use the images with the same storage, e.g.
#   buildah --root "$NDI_BUILDAH_ROOT" --runroot "$NDI_BUILDAH_RUNROOT" images
set -euo pipefail

# shellcheck source-path=SCRIPTDIR source=common.sh
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
SUITE=bookworm
VARIANT=minbase
FLAVORS=("$@")
((${#FLAVORS[@]})) || FLAVORS=(cos ubuntu)
SUBSTITUTE="local debootstrap"  # how a substitute base's description starts

log() { printf '[images] %s\n' "$*" >&2; }
die() { printf '[images] error: %s\n' "$*" >&2; exit 1; }

DOCKERFILES=()
for f in "${FLAVORS[@]}"; do
  [[ -f $REPO/images/$f/Dockerfile ]] || die "no images/$f/Dockerfile (flavors: cos ubuntu)"
  DOCKERFILES+=("images/$f/Dockerfile")
done
((EUID == 0)) || die "run as root (debootstrap and buildah's chroot isolation need it)"
# The bases, as the Dockerfiles name them (FROM [--platform=...] <ref> [AS stage]; the
# build stage's $BUILD_BASE is its ARG's default).
build_base_of() {
  sed -n 's/^ARG[[:space:]]\{1,\}BUILD_BASE=\([^[:space:]]*\).*/\1/p' "$REPO/images/$1/Dockerfile"
}
from_names() {
  local build_base
  build_base=$(build_base_of "$1")
  sed -n 's/^FROM[[:space:]]\{1,\}\(--[^[:space:]]*[[:space:]]\{1,\}\)*\([^[:space:]]*\).*/\2/p' \
    "$REPO/images/$1/Dockerfile" | sed -e "s|^\\\$BUILD_BASE\$|$build_base|" -e "s|^\\\${BUILD_BASE}\$|$build_base|"
}
mapfile -t BASE_NAMES < <(for f in "${FLAVORS[@]}"; do from_names "$f"; done | sort -u)

((${#ARCHES[@]})) || die "NDI_IMAGE_ARCHES is empty (architectures: amd64 arm64)"
declare -A QEMU_ARCH=([amd64]=x86_64 [arm64]=aarch64)
FOREIGN=()
for arch in "${ARCHES[@]}"; do
  [[ -n ${QEMU_ARCH[$arch]:-} ]] || die "NDI_IMAGE_ARCHES names '$arch': the architectures are amd64 arm64 (Debian's names)"
  [[ $arch == "$HOST_ARCH" ]] || FOREIGN+=("$arch")
done
[[ $(printf '%s\n' "${ARCHES[@]}" | sort | uniq -d) == "" ]] || die "NDI_IMAGE_ARCHES names an architecture twice: ${ARCHES[*]}"
# Every image's build stage (the venv) runs on this machine's architecture (the
# Dockerfiles' FROM --platform=$BUILDPLATFORM): its bases are needed for it too.
BASE_ARCHES=("${ARCHES[@]}")
[[ " ${ARCHES[*]} " == *" $HOST_ARCH "* ]] || BASE_ARCHES+=("$HOST_ARCH")

# --- tools ---------------------------------------------------------------------
need=()
command -v buildah >/dev/null || need+=(buildah)
[[ $LOCAL_BASE != 1 ]] || command -v debootstrap >/dev/null || need+=(debootstrap)
for arch in "${FOREIGN[@]}"; do
  [[ -e /usr/lib/binfmt.d/qemu-${QEMU_ARCH[$arch]}.conf ]] || { need+=(qemu-user-static); break; }
done
if ((${#need[@]})); then
  log "installing ${need[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
fi

# Another architecture's programs (RUN steps, debootstrap's second stage) run under
# qemu-user-static, found by the kernel through binfmt_misc. Its package ships the
# registration (/usr/lib/binfmt.d/qemu-<arch>.conf) but only systemd-binfmt or
# binfmt-support load it, and neither runs in a container or a machine without them:
# load it here. The F flag (the interpreter opened at registration) is what lets it run
# inside the build's chroot, which has no qemu of its own (Documentation/admin-guide/
# binfmt-misc.rst, "F - fix binary").
binfmt_ready() {
  local qarch=${QEMU_ARCH[$1]} dir=/proc/sys/fs/binfmt_misc
  local conf=/usr/lib/binfmt.d/qemu-${QEMU_ARCH[$1]}.conf entry
  entry=$dir/qemu-$qarch
  [[ -e $dir/register ]] || mount -t binfmt_misc binfmt_misc "$dir" ||
    die "cannot mount binfmt_misc on $dir: $1 images need qemu-user-static registered there (or build only NDI_IMAGE_ARCHES=$HOST_ARCH)"
  if [[ ! -e $entry ]]; then
    [[ -s $conf ]] || die "no $conf: apt-get install qemu-user-static (or build only NDI_IMAGE_ARCHES=$HOST_ARCH)"
    cat "$conf" >"$dir/register" || die "cannot register $conf in $dir/register"
    log "registered qemu-$qarch with binfmt_misc ($conf)"
  fi
  grep -qx enabled "$entry" || die "$entry is disabled: echo 1 > $entry"
  grep -q '^flags:.*F' "$entry" ||
    die "$entry lacks the F flag, so a chroot cannot find its interpreter: echo -1 > $entry, then rerun"
}
for arch in "${FOREIGN[@]}"; do binfmt_ready "$arch"; done

mkdir -p "$CACHE" "$STORAGE_ROOT" "$RUNROOT"
T0=$SECONDS

# --- the real bases ------------------------------------------------------------------
# One name holds one image in a storage, so each architecture's base is kept under a name
# of its own (real_ref) and tagged as the FROM name just before that architecture builds.
real_ref() { printf 'localhost/ndi-real-%s/%s' "$2" "${1#*/}"; }
real_bases() {
  local name description arch ref
  for name in "${BASE_NAMES[@]}"; do
    description=$(bah inspect --type image --format \
      '{{index .OCIv1.Config.Labels "org.opencontainers.image.description"}}' "$name" 2>/dev/null) || description=
    [[ $description != "$SUBSTITUTE"* ]] ||
      die "$name in $STORAGE_ROOT is the local substitute of an NDI_LOCAL_BASE=1 build: give real builds a storage of their own (NDI_BUILDAH_ROOT)"
    for arch in "${BASE_ARCHES[@]}"; do
      ref=$(real_ref "$name" "$arch")
      [[ $(image_arch "$ref") == "$arch" ]] && continue
      log "pulling the base $name for $arch ..."
      bah pull -q --policy always --arch "$arch" "$name" >/dev/null ||
        die "cannot pull the base image $name for $arch (a FROM of ${DOCKERFILES[*]}): its registry is unreachable from here. Build where it is reachable, or set NDI_LOCAL_BASE=1 for a local check build (a Debian bookworm substitute for every base: not an image to ship)"
      [[ $(image_arch "$name") == "$arch" ]] || die "the registry gave no $arch image for $name"
      bah tag "$name" "$ref"
    done
  done
  log "bases: ${BASE_NAMES[*]} for ${BASE_ARCHES[*]} (the real ones)"
}
image_arch() { bah inspect --type image --format '{{.OCIv1.Architecture}}' "$1" 2>/dev/null || true; }

local_base() {
# --- the Debian mirror, from this machine's apt sources ---------------------------
# The first source serving the plain "$SUITE" suite (not -updates/-security),
# from deb822 *.sources files or one-line *.list files.
find_mirror() {
  /usr/bin/python3 - "$SUITE" <<'PY'
import glob, re, sys
suite = sys.argv[1]
files = sorted(glob.glob("/etc/apt/sources.list.d/*.sources"))
lists = ["/etc/apt/sources.list"] + sorted(glob.glob("/etc/apt/sources.list.d/*.list"))
for path in files:
    try:
        text = open(path, encoding="utf-8").read()
    except OSError:
        continue
    for stanza in re.split(r"\n\s*\n", text):
        fields = {}
        for line in stanza.splitlines():
            if line.startswith("#") or ":" not in line or line[:1].isspace():
                continue
            key, _, value = line.partition(":")
            fields[key.strip().lower()] = value.split()
        if fields.get("enabled", ["yes"])[0].lower() == "no":
            continue
        if "deb" in fields.get("types", []) and suite in fields.get("suites", []):
            for uri in fields.get("uris", []):
                if uri.startswith(("http://", "https://")):
                    print(uri); sys.exit(0)
for path in lists:
    try:
        lines = open(path, encoding="utf-8").read().splitlines()
    except OSError:
        continue
    for line in lines:
        words = re.sub(r"\[[^]]*\]", "", line.split("#", 1)[0]).split()
        if len(words) >= 3 and words[0] == "deb" and words[2] == suite \
                and words[1].startswith(("http://", "https://")):
            print(words[1]); sys.exit(0)
sys.exit(1)
PY
}
MIRROR=${NDI_DEBIAN_MIRROR:-$(find_mirror)} ||
  die "no apt source for '$SUITE' in /etc/apt/sources.list{,.d/*}; set NDI_DEBIAN_MIRROR"

# --- the base, per architecture: debootstrap once per archive state and arguments -----
# Keyed by content: the suite's Release file (the checksums of every package index
# debootstrap reads; a stable suite's changes only at a point release), not by the day, so
# the slow arm64 base (its second stage under qemu-user) and every layer above it stay
# cached until the archive changes. NDI_BASE_DATE keys by that date instead (a rebuild).
INCLUDE=ca-certificates
RECIPE=5  # bump when the base preparation below changes
if [[ -n ${NDI_BASE_DATE:-} ]]; then
  [[ $NDI_BASE_DATE =~ ^[0-9]{4}-[0-9]{2}-[0-9]{2}$ ]] || die "NDI_BASE_DATE '$NDI_BASE_DATE' is not a day like 2026-11-29"
  STATE="date $NDI_BASE_DATE"
  STATE_KEY=$NDI_BASE_DATE
elif release=$(curl -fsSL --retry 2 -m 60 "${MIRROR%/}/dists/$SUITE/Release"); then
  STATE="Debian $(sed -n 's/^Version: //p' <<<"$release"), Release of $(sed -n 's/^Date: //p' <<<"$release")"
  STATE_KEY=r$(sha256sum <<<"$release" | cut -c1-12)
else
  die "cannot read ${MIRROR%/}/dists/$SUITE/Release (the base's cache key): is the mirror reachable? (NDI_DEBIAN_MIRROR; NDI_BASE_DATE=<day> keys by a day instead)"
fi
for arch in "${BASE_ARCHES[@]}"; do local_base_for "$arch"; done
# Older bases of the architectures built now (another archive state or recipe, or named
# before the architecture was in the name) are no longer needed. Another architecture's
# stays: the pod tier builds only amd64 in this storage, and removing the arm64 base would
# orphan every cached arm64 layer (a recommitted base is a new image ID).
old_bases=$(bah images --format '{{.Name}}:{{.Tag}}' --filter reference=localhost/ndi-base 2>/dev/null |
  grep -E "^localhost/ndi-base:$SUITE-(($(IFS='|'; echo "${BASE_ARCHES[*]}"))-)?[0-9a-f]{12}\$" |
  grep -vxF "${LOCAL_BASE_IMAGE[@]/#/-e}") || true
[[ -z $old_bases ]] || xargs buildah --root "$STORAGE_ROOT" --runroot "$RUNROOT" rmi -f <<<"$old_bases" >/dev/null 2>&1 || true
log "BOTH flavours are built FROM the bookworm base here (NDI_LOCAL_BASE=1: a local substitute," \
    "not the real bases), for ${ARCHES[*]}"
}

# local_base_for ARCH: debootstrap's bookworm for ARCH, cached as a tar and committed as
# LOCAL_BASE_IMAGE[ARCH]. A foreign architecture's second stage (its packages' maintainer
# scripts) runs under qemu-user-static: minutes, hence the cache.
declare -A LOCAL_BASE_IMAGE=()
local_base_for() {
local arch=$1 t=$SECONDS key base_tar base_image work r ctr
key=$(printf '%s\n' "$SUITE" "$VARIANT" "$INCLUDE" "$MIRROR" "$STATE_KEY" "$RECIPE" "$arch" | sha256sum | cut -c1-12)
base_tar=$CACHE/$SUITE-$VARIANT-$arch-$STATE_KEY-$key.tar
base_image=localhost/ndi-base:$SUITE-$arch-$key
LOCAL_BASE_IMAGE[$arch]=$base_image

if [[ ! -s $base_tar ]]; then
  # The rootfs must sit on a real filesystem (not tmpfs) big enough for ~200 MB.
  work=$(mktemp -d "$CACHE/debootstrap.XXXXXX")
  # shellcheck disable=SC2064  # $work now: the trap outlives this function's locals
  trap "rm -rf '$work'" EXIT
  log "debootstrap --variant=$VARIANT --arch=$arch $SUITE (mirror from apt sources) ..."
  debootstrap --variant="$VARIANT" --arch="$arch" --include="$INCLUDE" "$SUITE" "$work/rootfs" "$MIRROR" \
    >"$work/debootstrap.log" 2>&1 || { tail -20 "$work/debootstrap.log" >&2; die "debootstrap ($arch) failed"; }
  # Slim it like the official -slim images: no docs, man pages or locales
  # (now, and for every package the Dockerfiles install), no .debs, no apt
  # lists (the Dockerfiles' RUN steps run apt-get update).
  r=$work/rootfs
  cat >"$r/etc/dpkg/dpkg.cfg.d/ndi-slim" <<'CFG'
path-exclude /usr/share/doc/*
path-include /usr/share/doc/*/copyright
path-exclude /usr/share/man/*
path-exclude /usr/share/groff/*
path-exclude /usr/share/info/*
path-exclude /usr/share/locale/*
path-exclude /usr/share/lintian/*
path-exclude /usr/share/linda/*
CFG
  find "$r/usr/share/doc" -mindepth 1 ! -name copyright ! -type d -delete 2>/dev/null || true
  find "$r/usr/share/doc" -mindepth 1 -type d -empty -delete 2>/dev/null || true
  rm -rf "$r/usr/share/man/"* "$r/usr/share/info/"* "$r/usr/share/locale/"* \
    "$r/usr/share/groff/"* "$r/usr/share/lintian/"*
  # apt settings of the official images: drop .debs after every install, no
  # binary package caches, no translations.
  cat >"$r/etc/apt/apt.conf.d/docker-clean" <<'CFG'
DPkg::Post-Invoke { "rm -f /var/cache/apt/archives/*.deb /var/cache/apt/archives/partial/*.deb /var/cache/apt/*.bin || true"; };
APT::Update::Post-Invoke { "rm -f /var/cache/apt/archives/*.deb /var/cache/apt/archives/partial/*.deb /var/cache/apt/*.bin || true"; };
Dir::Cache::pkgcache "";
Dir::Cache::srcpkgcache "";
CFG
  echo 'Acquire::Languages "none";' >"$r/etc/apt/apt.conf.d/docker-no-languages"
  rm -rf "$r/var/cache/apt/archives/"*.deb "$r/var/cache/apt/"*.bin "$r/var/lib/apt/lists/"*
  # An empty /dev, as registry images have (a container's /dev comes from its
  # runtime and mounts): the device nodes debootstrap leaves would hide a
  # missing one. make test-pod checks the images and runs them so.
  find "$r/dev" -mindepth 1 -delete
  # RUN steps need name resolution; buildah bind-mounts its own resolv.conf.
  : >"$work/rootfs/etc/resolv.conf"
  tar --numeric-owner --xattrs -C "$work/rootfs" -cf "$work/base.tar" .
  mv "$work/base.tar" "$base_tar"
  rm -rf "$work"; trap - EXIT
  # Keep only the newest few bases of this architecture
  # (and the tars of before the architecture was in their names).
  find "$CACHE" -maxdepth 1 -name "$SUITE-$VARIANT-20[0-9][0-9]-*.tar" -delete
  find "$CACHE" -maxdepth 1 -name "$SUITE-$VARIANT-$arch-*.tar" -printf '%T@ %p\n' |
    sort -rn | tail -n +4 | cut -d' ' -f2- | xargs -r -d '\n' rm -f
  log "base rootfs ($arch) cached: $base_tar ($((SECONDS - t)) s)"
else
  log "base rootfs ($arch) from cache: $base_tar"
fi

if ! bah inspect --type image "$base_image" >/dev/null 2>&1; then
  ctr=$(bah from --pull-never --arch "$arch" scratch)
  bah add "$ctr" "$base_tar" / >/dev/null
  bah config --cmd /bin/bash --env PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    --arch "$arch" --os linux \
    --label org.opencontainers.image.description="$SUBSTITUTE $SUITE $VARIANT $arch base ($STATE)" \
    "$ctr"
  bah commit --rm -q "$ctr" "$base_image" >/dev/null
  log "base image $base_image committed"
fi
[[ $(image_arch "$base_image") == "$arch" ]] || die "$base_image is not an $arch image"
}
if [[ $LOCAL_BASE == 1 ]]; then local_base; else real_bases; fi

# --- build context: only what the Dockerfiles COPY ------------------------------------
ctx=$(mktemp -d "$CACHE/context.XXXXXX")
trap 'rm -rf "$ctx"' EXIT
cp "$REPO/pyproject.toml" "$ctx/"
mkdir "$ctx/images" && cp "$REPO/images/requirements.lock" "$ctx/images/"
if [[ -f $REPO/README.md ]]; then
  cp "$REPO/README.md" "$ctx/"
else
  log "README.md missing: using a stub for the wheel's long description"
  echo "# nvidia-driver-installer" >"$ctx/README.md"
fi
tar -C "$REPO" --exclude=__pycache__ --exclude='*.pyc' -cf - installer | tar -C "$ctx" -xf -

[[ -n $VERSION ]] || die "cannot read __version__ from installer/__init__.py"
REVISION=$(git -C "$REPO" rev-parse HEAD 2>/dev/null || echo unknown)
# The commit's time, not now: an unchanged tree rebuilds to the same image.
CREATED=$(TZ=UTC git -C "$REPO" log -1 --format=%cd --date=format-local:%Y-%m-%dT%H:%M:%SZ 2>/dev/null ||
  date -u +%Y-%m-%dT%H:%M:%SZ)

# RUN steps share the host network (chroot isolation). When this machine's
# egress re-signs TLS with its own CA, give pip inside the build that bundle;
# it is mounted only during RUN steps and is not part of any layer.
build_args=(--build-arg "VERSION=$VERSION" --build-arg "REVISION=$REVISION" --build-arg "CREATED=$CREATED")
volumes=()
host_ca=${PIP_CERT:-/etc/ssl/certs/ca-certificates.crt}
if [[ -s $host_ca ]]; then
  volumes+=(--volume "$host_ca:/run/ndi-build-ca.pem:ro")
  build_args+=(--build-arg PIP_CERT=/run/ndi-build-ca.pem)
fi

# buildah's chroot isolation re-executes buildah from a sealed memfd copy of itself
# (containers/storage pkg/unshare/unshare.c, copy_self_proc_exe). Sealing with
# F_SEAL_WRITE fails with EBUSY when the kernel still sees extra references on the
# copy's pages after about 150 ms of backoff (mm/memfd.c, memfd_wait_for_pins): a
# transient state of the machine, not of the build, seen once in CI as
# "Close_Fd sealing memfd copy: Device or resource busy". Only that failure is
# retried, at most twice; the layer cache keeps the steps already built.
bud_with_retry() {
  local flavor=$1 image=$2 arch=$3 attempt err platform
  mapfile -t platform < <(platform_args "$flavor" "$arch")
  err=$(mktemp "$CACHE/bud-stderr.XXXXXX")
  for attempt in 1 2 3; do
    if bah bud --arch "$arch" --os linux --isolation chroot --pull-never --layers --quiet \
      "${volumes[@]}" "${build_args[@]}" "${platform[@]}" \
      -f "$REPO/images/$flavor/Dockerfile" -t "$image" "$ctx" >/dev/null 2>"$err"; then
      cat "$err" >&2
      rm -f "$err"
      return 0
    fi
    cat "$err" >&2
    if ! grep -q 'sealing memfd copy' "$err" || ((attempt == 3)); then break; fi
    log "attempt $attempt of $image hit buildah's re-exec seal (EBUSY, transient): retrying"
  done
  rm -f "$err"
  die "building $image failed (buildah's output above)"
}

# platform_args FLAVOR ARCH (one word a line): the build stage runs on this machine's
# architecture, FROM this architecture's variant of its base (BUILD_BASE: while ARCH is
# built, the FROM names hold ARCH's bases), so another architecture's venv is made
# without qemu-user; and the platform arguments buildah 1.28 does not predefine
# (BuildKit and newer buildah do, with these values).
platform_args() {
  local build_base
  if [[ $LOCAL_BASE == 1 ]]; then build_base=${LOCAL_BASE_IMAGE[$HOST_ARCH]}
  else build_base=$(real_ref "$(build_base_of "$1")" "$HOST_ARCH"); fi
  printf -- '--build-arg\n%s\n' "BUILD_BASE=$build_base" "BUILDPLATFORM=linux/$HOST_ARCH" \
    "BUILDARCH=$HOST_ARCH" "TARGETPLATFORM=linux/$2" "TARGETARCH=$2"
}

# use_bases ARCH: the Dockerfiles' FROM names now name ARCH's bases (one name holds one
# image: the builds of one architecture after the other).
use_bases() {
  local name
  for name in "${BASE_NAMES[@]}"; do
    if [[ $LOCAL_BASE == 1 ]]; then bah tag "${LOCAL_BASE_IMAGE[$1]}" "$name"
    else bah tag "$(real_ref "$name" "$1")" "$name"; fi
  done
}

for arch in "${ARCHES[@]}"; do
  use_bases "$arch"
  for flavor in "${FLAVORS[@]}"; do
    image=$(arch_ref "$flavor" "$arch")
    t=$SECONDS
    log "building $image ($arch) from images/$flavor/Dockerfile ..."
    bud_with_retry "$flavor" "$image" "$arch"
    [[ $(image_arch "$image") == "$arch" ]] || die "$image was built, but not for $arch"
    log "built $image ($(bah images --format '{{.ID}}, {{.Size}}' "$image"), $((SECONDS - t)) s)"
    if [[ -n ${NDI_EXPORT_DIR:-} ]]; then
      mkdir -p "$NDI_EXPORT_DIR"
      out=$NDI_EXPORT_DIR/nvidia-driver-installer-$flavor-$arch.oci.tar
      rm -f "$out"
      bah push -q "$image" "oci-archive:$out:$(built_ref "$flavor")" >/dev/null
      log "exported $out"
    fi
  done
done

# One manifest list per flavour over its architectures' images (made anew: an old list
# would keep the instances it had), and the plain tag on this machine's architecture.
for flavor in "${FLAVORS[@]}"; do
  list=$(list_ref "$flavor")
  bah manifest rm "$list" >/dev/null 2>&1 || true
  bah manifest create "$list" >/dev/null
  for arch in "${ARCHES[@]}"; do
    bah manifest add --os linux --arch "$arch" "$list" \
      "containers-storage:$(arch_ref "$flavor" "$arch")" >/dev/null
  done
  native=${ARCHES[0]}
  [[ " ${ARCHES[*]} " != *" $HOST_ARCH "* ]] || native=$HOST_ARCH
  bah tag "$(arch_ref "$flavor" "$native")" "$(built_ref "$flavor")"
  log "manifest list $list: ${ARCHES[*]}; $(built_ref "$flavor") is the $native image"
done

log "done in $((SECONDS - T0)) s; images in buildah storage $STORAGE_ROOT:"
bah images --filter reference='localhost/nvidia-driver-installer-*' >&2
