#!/usr/bin/env bash
# Builds the Debian packages (debian/) from this checkout's files: a copy of
# the tracked and untracked-but-not-ignored files in a temporary directory,
# `dpkg-buildpackage -us -uc -b` there, then lintian on the result. The
# .deb files, the .changes and lintian's report (lintian.txt) go to DEST.
# Usage: tools/deb-build.sh DEST
set -euo pipefail
dest=${1:?usage: tools/deb-build.sh DEST}
top=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
mkdir -p "$dest"
dest=$(cd "$dest" && pwd)
work=$(mktemp -d /tmp/tiermem-deb-XXXXXX)
trap 'rm -rf "$work"' EXIT
mkdir "$work/tiermem"
(cd "$top" && git ls-files -z --cached --others --exclude-standard | xargs -0 cp --parents -t "$work/tiermem" 2>/dev/null ||
   { echo "deb-build: copying the sources failed" >&2; exit 1; })
# Symbolic links are copied as links by cp --parents (debian/tiermemd.sysusers).
cd "$work/tiermem"
echo "deb-build: dpkg-buildpackage in $work/tiermem" >&2
DEB_BUILD_OPTIONS="nocheck parallel=$(nproc)" dpkg-buildpackage -us -uc -b >"$dest/build.log" 2>&1 ||
  { tail -40 "$dest/build.log" >&2; echo "deb-build: dpkg-buildpackage failed (log: $dest/build.log)" >&2; exit 1; }
cp "$work"/*.deb "$work"/*.changes "$work"/*.buildinfo "$dest/"
# Lintian: errors and warnings fail; what remains is explained in
# debian/*.lintian-overrides.
rc=0
lintian --fail-on error,warning --info "$work"/*.changes >"$dest/lintian.txt" 2>&1 || rc=$?
cat "$dest/lintian.txt"
ls -1 "$dest"/*.deb
exit "$rc"
