#!/usr/bin/env bash
# Debian packages the default test run and the demo need, or the packages
# named as arguments (a slow tier's own). Idempotent.
set -euo pipefail
pkgs=("$@")
default=0
((${#pkgs[@]})) || { default=1; pkgs=(makeself bubblewrap libseccomp2 busybox-static cpio kmod util-linux gcc make python3-venv ca-certificates curl shellcheck libtirpc3); }
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi
# NVIDIA's real nvidia-modprobe and nvidia-persistenced (Debian contrib, which the
# machine's apt config may not enable) for the default run's fixture payload: fetched with
# a private apt config into their caches (tests/fixtures/realmodprobe.py,
# realpersistenced.py); /etc/apt is not touched. nvidia-persistenced needs libtirpc3.
if ((default)); then
  cd "$(dirname "$0")/.."
  /usr/bin/python3 -m tests.fixtures.realmodprobe >/dev/null
  /usr/bin/python3 -m tests.fixtures.realpersistenced >/dev/null
  # Debian's prometheus and promtool (main), the same way: the health sidecar's scrape
  # and alert-rule tests (tests/fixtures/realprometheus.py).
  /usr/bin/python3 -m tests.fixtures.realprometheus >/dev/null
fi
