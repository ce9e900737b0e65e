#!/usr/bin/env bash
# Build both installer images with buildah, without a Docker engine:
#
#   1. the bases: by default the real ones each Dockerfile names in its FROM
#      lines (docker.io/library/debian:12-slim for cos, docker.io/library/
#      ubuntu:22.04 for ubuntu), pulled once into a private buildah storage;
#      the build stops, naming the base, when its registry is unreachable.
#      With NDI_LOCAL_BASE=1 (the test tiers, and machines without that
#      registry) a local Debian bookworm base made with `debootstrap
#      --variant=minbase` is tagged under those names instead: a LOCAL
#      SUBSTITUTE, so the Ubuntu image then has a Debian userland (a check of
#      the Dockerfile and the package, not an Ubuntu image to ship);
#   2. `buildah bud --isolation chroot --pull-never` for images/cos and
#      images/ubuntu.
#
# Usage: images/build.sh [FLAVOR...]          (default: cos ubuntu; needs root)
# Environment:
#   NDI_LOCAL_BASE      1: the local debootstrap substitute for every base (0)
#   NDI_IMAGE_CACHE     base cache dir               (/var/cache/ndi-images)
#   NDI_BUILDAH_ROOT    buildah storage root         ($NDI_IMAGE_CACHE/storage-real;
#                                                     with NDI_LOCAL_BASE=1 .../storage)
#   NDI_BUILDAH_RUNROOT buildah run root             (/run/ndi-images)
#   NDI_DEBIAN_MIRROR   Debian mirror for debootstrap (default: from apt sources)
#   NDI_BASE_DATE       cache key date               (today, UTC)
#   NDI_IMAGE_TAG       image tag                    (the package version)
#   NDI_EXPORT_DIR      also write <dir>/nvidia-driver-installer-<flavor>.oci.tar
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
# The bases, as the Dockerfiles name them (FROM <ref> [AS stage]).
mapfile -t BASE_NAMES < <(for f in "${FLAVORS[@]}"; do
  sed -n 's/^FROM[[:space:]]\{1,\}\([^[:space:]]*\).*/\1/p' "$REPO/images/$f/Dockerfile"; done | sort -u)

# --- tools ---------------------------------------------------------------------
need=()
command -v buildah >/dev/null || need+=(buildah)
[[ $LOCAL_BASE != 1 ]] || command -v debootstrap >/dev/null || need+=(debootstrap)
if ((${#need[@]})); then
  log "installing ${need[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
fi

mkdir -p "$CACHE" "$STORAGE_ROOT" "$RUNROOT"
T0=$SECONDS

# --- the real bases ------------------------------------------------------------------
real_bases() {
  local name description
  for name in "${BASE_NAMES[@]}"; do
    description=$(bah inspect --type image --format \
      '{{index .OCIv1.Config.Labels "org.opencontainers.image.description"}}' "$name" 2>/dev/null) || description=
    [[ $description != "$SUBSTITUTE"* ]] ||
      die "$name in $STORAGE_ROOT is the local substitute of an NDI_LOCAL_BASE=1 build: give real builds a storage of their own (NDI_BUILDAH_ROOT)"
    bah inspect --type image "$name" >/dev/null 2>&1 && continue
    log "pulling the base $name ..."
    bah pull -q "$name" >/dev/null ||
      die "cannot pull the base image $name (a FROM of ${DOCKERFILES[*]}): its registry is unreachable from here. Build where it is reachable, or set NDI_LOCAL_BASE=1 for a local check build (a Debian bookworm substitute for every base: not an image to ship)"
  done
  log "bases: ${BASE_NAMES[*]} (the real ones)"
}

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

# --- the base: debootstrap once per day and arguments -------------------------------
INCLUDE=ca-certificates
RECIPE=4  # bump when the base preparation below changes
DATE=${NDI_BASE_DATE:-$(date -u +%Y-%m-%d)}
KEY=$(printf '%s\n' "$SUITE" "$VARIANT" "$INCLUDE" "$MIRROR" "$DATE" "$RECIPE" | sha256sum | cut -c1-12)
BASE_TAR=$CACHE/$SUITE-$VARIANT-$DATE-$KEY.tar
BASE_IMAGE=localhost/ndi-base:$SUITE-$KEY

if [[ ! -s $BASE_TAR ]]; then
  # The rootfs must sit on a real filesystem (not tmpfs) big enough for ~200 MB.
  work=$(mktemp -d "$CACHE/debootstrap.XXXXXX")
  trap 'rm -rf "$work"' EXIT
  log "debootstrap --variant=$VARIANT $SUITE (mirror from apt sources) ..."
  debootstrap --variant="$VARIANT" --include="$INCLUDE" "$SUITE" "$work/rootfs" "$MIRROR" \
    >"$work/debootstrap.log" 2>&1 || { tail -20 "$work/debootstrap.log" >&2; die "debootstrap failed"; }
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
  mv "$work/base.tar" "$BASE_TAR"
  rm -rf "$work"; trap - EXIT
  # Keep only the newest few bases.
  find "$CACHE" -maxdepth 1 -name "$SUITE-$VARIANT-*.tar" -printf '%T@ %p\n' |
    sort -rn | tail -n +4 | cut -d' ' -f2- | xargs -r -d '\n' rm -f
  log "base rootfs cached: $BASE_TAR ($((SECONDS - T0)) s)"
else
  log "base rootfs from cache: $BASE_TAR"
fi

if ! bah inspect --type image "$BASE_IMAGE" >/dev/null 2>&1; then
  ctr=$(bah from --pull-never scratch)
  bah add "$ctr" "$BASE_TAR" / >/dev/null
  bah config --cmd /bin/bash --env PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    --label org.opencontainers.image.description="$SUBSTITUTE $SUITE $VARIANT base ($DATE)" \
    "$ctr"
  bah commit --rm -q "$ctr" "$BASE_IMAGE" >/dev/null
  log "base image $BASE_IMAGE committed"
fi
# Older bases (another day or recipe) are no longer needed.
bah images --format '{{.Name}}:{{.Tag}}' --filter reference=localhost/ndi-base 2>/dev/null |
  grep -vxF "$BASE_IMAGE" | xargs -r buildah --root "$STORAGE_ROOT" --runroot "$RUNROOT" rmi -f >/dev/null 2>&1 || true
for name in "${BASE_NAMES[@]}"; do
  bah tag "$BASE_IMAGE" "$name"
done
log "mapped ${BASE_NAMES[*]} -> $BASE_IMAGE (debootstrap $SUITE):" \
    "BOTH flavours are built FROM the bookworm base here (NDI_LOCAL_BASE=1: a local substitute," \
    "not the real bases)"
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
TAG=$BUILT_TAG
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
  local flavor=$1 image=$2 attempt err
  err=$(mktemp "$CACHE/bud-stderr.XXXXXX")
  for attempt in 1 2 3; do
    if bah bud --isolation chroot --pull-never --layers --quiet \
      "${volumes[@]}" "${build_args[@]}" \
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

for flavor in "${FLAVORS[@]}"; do
  image=localhost/nvidia-driver-installer-$flavor:$TAG
  t=$SECONDS
  log "building $image from images/$flavor/Dockerfile ..."
  bud_with_retry "$flavor" "$image"
  log "built $image ($(bah images --format '{{.ID}}, {{.Size}}' "$image"), $((SECONDS - t)) s)"
  if [[ -n ${NDI_EXPORT_DIR:-} ]]; then
    mkdir -p "$NDI_EXPORT_DIR"
    out=$NDI_EXPORT_DIR/nvidia-driver-installer-$flavor.oci.tar
    rm -f "$out"
    bah push -q "$image" "oci-archive:$out:$image" >/dev/null
    log "exported $out"
  fi
done

log "done in $((SECONDS - T0)) s; images in buildah storage $STORAGE_ROOT:"
bah images --filter reference='localhost/nvidia-driver-installer-*' >&2
