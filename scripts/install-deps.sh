#!/usr/bin/env bash
# Debian packages the default test run and the demo need, or the packages
# named as arguments (a slow tier's own). Idempotent.
set -euo pipefail
pkgs=("$@")
((${#pkgs[@]})) || pkgs=(makeself busybox-static cpio kmod util-linux gcc make python3-venv ca-certificates curl)
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi
