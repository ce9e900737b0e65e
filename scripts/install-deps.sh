#!/usr/bin/env bash
# Debian packages the default test run and the demo need, or the packages
# named as arguments (a slow tier's own). Idempotent.
set -euo pipefail
pkgs=("$@")
default=0
((${#pkgs[@]})) || { default=1; pkgs=(makeself bubblewrap libseccomp2 busybox-static cpio kmod util-linux gcc make python3-venv ca-certificates curl shellcheck); }
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi
# NVIDIA's real nvidia-modprobe (Debian contrib, which the machine's apt config may not
# enable) for the default run's fixture payload: fetched with a private apt config into
# its cache (tests/fixtures/realmodprobe.py); /etc/apt is not touched.
if ((default)); then
  cd "$(dirname "$0")/.."
  /usr/bin/python3 -m tests.fixtures.realmodprobe >/dev/null
fi
