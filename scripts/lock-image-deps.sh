#!/usr/bin/env bash
# Regenerate images/requirements.lock from pyproject.toml's [project] dependencies and its
# [build-system] requires (the images build our wheel without build isolation, from these
# pinned files only), with the sha256 of every distribution file (pip-tools' pip-compile
# in a throw-away venv).
set -euo pipefail
cd "$(dirname "$0")/.."
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
/usr/bin/python3 -m venv "$work/venv"
"$work/venv/bin/pip" install -q pip-tools
/usr/bin/python3 -c 'import tomllib; t = tomllib.load(open("pyproject.toml", "rb")); print("\n".join(t["project"]["dependencies"] + t["build-system"]["requires"]))' >"$work/requirements.in"
# From inside $work: the "# via -r requirements.in" comments name no temporary path.
(cd "$work" && venv/bin/pip-compile -q --generate-hashes --no-header --allow-unsafe \
  --strip-extras --no-emit-index-url --no-emit-find-links -o requirements.lock requirements.in)
{ awk '/^#/ { print; next } { exit }' images/requirements.lock; cat "$work/requirements.lock"; } >"$work/out"
mv "$work/out" images/requirements.lock
echo "wrote images/requirements.lock"
