#!/usr/bin/env bash
# The Debian packages, built and installed as an operator would (issue 26):
# tools/deb-build.sh builds them from this checkout (lintian clean but for
# the explained overrides), `apt-get install ./*.deb` installs them on this
# machine, the daemon starts as its own user from the packaged configuration
# (as its unit would: the unit's directories made as systemd makes them), a
# user in group tiermem connects to its socket with tiermemctl and the Python
# module and one outside the group is refused, and `apt-get purge` leaves
# nothing behind but the system user and group (Debian keeps those).
#
# It installs into /usr and /etc: it runs as root only, and not when
# TIERMEM_PACKAGE_TEST=0 (exit 77: skipped); TIERMEM_DEBS=DIR takes the
# packages built there instead of building them. Usage: deb_test.sh OUTDIR
set -euo pipefail
out=${1:-$(mktemp -d /tmp/tiermem-debtest-XXXXXX)}
top=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
if [ "$(id -u)" -ne 0 ] || [ "${TIERMEM_PACKAGE_TEST:-1}" = 0 ]; then
  echo "deb_test: skipped (needs root; TIERMEM_PACKAGE_TEST=0 skips it)"
  exit 77
fi
for tool in dpkg-buildpackage lintian dh apt-get runuser setpriv systemd-sysusers; do
  command -v "$tool" >/dev/null || { echo "deb_test: $tool is missing (tools/setup.sh deps installs it)"; exit 1; }
done
packages=(tiermemd libtiermem0 libtiermem-dev tiermem-tools python3-tiermem)
user=tmpkg$$ outsider=tmout$$
pid=""
fail() { echo "deb_test: FAILED: $*"; exit 1; }
cleanup() {
  [ -n "$pid" ] && kill "$pid" 2>/dev/null && wait "$pid" 2>/dev/null
  userdel "$user" 2>/dev/null || true
  userdel "$outsider" 2>/dev/null || true
  DEBIAN_FRONTEND=noninteractive apt-get purge -y -q "${packages[@]}" >/dev/null 2>&1 || true
  rm -rf /run/tiermem "/dev/shm/tiermem-debtest-$$"
}
trap cleanup EXIT
cleanup  # an earlier run's leftovers

if [ -n "${TIERMEM_DEBS:-}" ]; then
  echo "== the packages built already in $TIERMEM_DEBS"
  mkdir -p "$out"
  cp "$TIERMEM_DEBS"/*.deb "$out/"
else
  echo "== building the packages"
  "$top/tools/deb-build.sh" "$out" || fail "the packages did not build, or lintian found errors or warnings"
fi
debs=()
for p in "${packages[@]}"; do
  deb=$(ls "$out/${p}_"*.deb 2>/dev/null | head -1)
  [ -n "$deb" ] || fail "no $p package"
  debs+=("$deb")
done

echo "== installing them"
DEBIAN_FRONTEND=noninteractive apt-get install -y -q "${debs[@]}" >"$out/install.log" 2>&1 ||
  { tail -20 "$out/install.log"; fail "apt-get install"; }
dpkg-query -L "${packages[@]}" | sort -u >"$out/files.txt"
getent group tiermem >/dev/null || fail "no group tiermem after install"
id -u tiermem >/dev/null || fail "no user tiermem after install"
[ -f /etc/tiermem/tiermemd.toml ] || fail "no /etc/tiermem/tiermemd.toml"
[ -L /etc/systemd/system/multi-user.target.wants/tiermemd.service ] || fail "tiermemd.service is not enabled"
systemd-analyze verify /lib/systemd/system/tiermemd.service 2>&1 | grep -v "^$" | sed 's/^/  verify: /' || true
for m in tiermemd.8 tiermemctl.8 tiermem-exec.1 tiermemd.toml.5; do
  grep -q "/man/man${m##*.}/$m.gz$" "$out/files.txt" || fail "man page $m is not installed"
done
grep -q "/cmake/tiermem/tiermemConfig.cmake$" "$out/files.txt" || fail "no CMake package config"
grep -q "/libtiermem.a$" "$out/files.txt" || fail "no static library"
/usr/sbin/tiermemd --version | grep -q "^tiermemd" || fail "tiermemd --version"

echo "== the daemon as its own user, from the packaged configuration"
# What the unit's RuntimeDirectory= and StateDirectory= make.
install -d -m 0750 -o tiermem -g tiermem /run/tiermem /var/lib/tiermem
# The packaged configuration but for the DRAM tier's directory: a machine
# that ran daemons as root may hold /dev/shm/tiermem-node1 (the daemon then
# refuses, rightly, to take another user's memory).
config=$out/tiermemd.toml
awk -v dram="/dev/shm/tiermem-debtest-$$" '/^\[/ { section = $0 }
  section == "[tiers.dram]" && /^path *=/ { print "path = \"" dram "\""; next } { print }' \
  /etc/tiermem/tiermemd.toml >"$config"
grep -q "tiermem-debtest-$$" "$config" || fail "no [tiers.dram] path in the packaged configuration"
chmod 0644 "$config"
runuser -u tiermem -- /usr/sbin/tiermemd --check-config --config "$config" >"$out/check.log" 2>&1 ||
  { cat "$out/check.log"; fail "tiermemd --check-config"; }
# setpriv execs it (runuser would stay between as its parent).
setpriv --reuid=tiermem --regid=tiermem --init-groups /usr/sbin/tiermemd --config "$config" >"$out/daemon.log" 2>&1 &
pid=$!
for _ in $(seq 100); do [ -S /run/tiermem/tiermemd.sock ] && break; sleep 0.1; done
[ -S /run/tiermem/tiermemd.sock ] || { cat "$out/daemon.log"; fail "no socket at /run/tiermem/tiermemd.sock"; }
[ "$(stat -c %U "/proc/$pid")" = tiermem ] || fail "the daemon does not run as tiermem"

echo "== a member of group tiermem connects; another user is refused"
useradd -M -N -G tiermem -s /usr/sbin/nologin "$user"
useradd -M -N -s /usr/sbin/nologin "$outsider"
runuser -u "$user" -- tiermemctl --socket /run/tiermem/tiermemd.sock status >"$out/status.txt" 2>&1 ||
  { cat "$out/status.txt"; fail "tiermemctl status as a member of group tiermem"; }
cat "$out/status.txt" | head -8
version=$(runuser -u "$user" -- python3 -c 'import tiermem; print(tiermem.__version__)')
[ "$version" = "$(dpkg-query -W -f='${Version}' libtiermem0)" ] ||
  fail "python3-tiermem says version $version, the library's package $(dpkg-query -W -f='${Version}' libtiermem0)"
runuser -u "$user" -- python3 -c '
import tiermem
with tiermem.connect("/run/tiermem/tiermemd.sock") as c:
    a = c.alloc(4096, tier="dram")
    c.write(a.gva, b"packaged")
    assert bytes(c.read(a.gva, 8)) == b"packaged"
    a.free()
print("python3-tiermem: alloc, write, read, free as", __import__("getpass").getuser())' || fail "the Python module against the packaged daemon"
if runuser -u "$outsider" -- tiermemctl --socket /run/tiermem/tiermemd.sock status >/dev/null 2>&1; then
  fail "a user outside group tiermem connected"
fi
kill -TERM "$pid"
wait "$pid" || fail "tiermemd did not stop cleanly on SIGTERM"
pid=""

echo "== purging them"
userdel "$user"
userdel "$outsider"
DEBIAN_FRONTEND=noninteractive apt-get purge -y -q "${packages[@]}" >"$out/purge.log" 2>&1 ||
  { tail -20 "$out/purge.log"; fail "apt-get purge"; }
left=0
while read -r f; do
  [ -e "$f" ] || continue
  [ -d "$f" ] && continue  # directories other packages share (/usr/bin, ...)
  echo "  left behind: $f"
  left=1
done <"$out/files.txt"
[ -e /etc/tiermem ] && { echo "  left behind: /etc/tiermem"; left=1; }
[ -e /etc/systemd/system/multi-user.target.wants/tiermemd.service ] && { echo "  left behind: the unit's enablement"; left=1; }
[ "$left" -eq 0 ] || fail "files left after purge"
echo "kept by policy: user and group tiermem ($(id tiermem)), /var/lib/tiermem (its state: $(ls /var/lib/tiermem 2>/dev/null | wc -l) entries)"
echo "deb_test: all passed"
