#!/usr/bin/env bash
# The Python package as pip installs it (issue 26): `pip install` of a copy
# of client/python into a fresh virtual environment, built against this
# build's libtiermem (PKG_CONFIG_PATH=BUILD/meson-uninstalled), once with
# /usr/bin/python3 and once with the first other python3 on the PATH (pyenv's
# on the development machines) when there is one; then tiermem.__version__ is
# the library's and the module allocates, writes and reads through a real
# daemon. Offline: --no-build-isolation --no-index (setuptools and wheel
# from Debian's python3-setuptools-whl and python3-wheel-whl, pybind11 from
# Debian's pybind11-dev headers).
# Usage: pip_test.sh BUILD_DIR
set -euo pipefail
build=$(cd "${1:?usage: pip_test.sh BUILD_DIR}" && pwd)
top=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
work=$(mktemp -d /tmp/tiermem-pip-XXXXXX)
export TIERMEM_CLUSTER_DIR=$work/cluster TIERMEM_BASE_PORT=$((21000 + RANDOM % 20000))
trap '"$top/tools/local-cluster.sh" stop >/dev/null 2>&1; rm -rf "$work"' EXIT
version=$(PKG_CONFIG_PATH=$build/meson-uninstalled pkg-config --modversion tiermem-uninstalled)
pythons=(/usr/bin/python3)
other=$(command -v python3 || true)
if [ -n "$other" ] && [ "$(readlink -f "$other")" != "$(readlink -f /usr/bin/python3)" ] &&
   "$other" -c 'import sys; assert sys.version_info >= (3, 9)' 2>/dev/null; then
  pythons+=("$other")
else
  echo "pip_test: no python3 on the PATH but /usr/bin/python3: one interpreter tested"
fi
"$top/tools/local-cluster.sh" start "$build" 1 >/dev/null
export TIERMEM_SOCKET=$TIERMEM_CLUSTER_DIR/node1/tiermemd.sock
failed=0
for py in "${pythons[@]}"; do
  n=$((${n:-0} + 1))
  env_dir=$work/venv$n src=$work/src$n
  cp -r "$top/client/python" "$src"
  rm -rf "$src/build" "$src"/*.egg-info
  "$py" -m venv "$env_dir"
  # Offline: the build's own requirements from Debian's wheels (pip would
  # fetch them from PyPI; pybind11 then comes from pybind11-dev's headers).
  "$env_dir/bin/python" -m pip install -q --no-index --find-links /usr/share/python-wheels setuptools wheel \
    >"$work/wheels$n.log" 2>&1 || { cat "$work/wheels$n.log"; echo "pip_test: FAILED: setuptools and wheel"; failed=1; continue; }
  label="$("$env_dir/bin/python" -c 'import sys; print("CPython %d.%d.%d" % sys.version_info[:3])') ($py)"
  echo "== pip install ./client/python with $label"
  if ! PKG_CONFIG_PATH=$build/meson-uninstalled CC="$(command -v ccache >/dev/null && echo 'ccache gcc' || echo gcc)" \
       "$env_dir/bin/python" -m pip install -q --no-build-isolation --no-index "$src" >"$work/pip$n.log" 2>&1; then
    tail -30 "$work/pip$n.log"
    echo "pip_test: FAILED: pip install with $label"
    failed=1
    continue
  fi
  (cd "$work" && "$env_dir/bin/python" - "$version" <<'PY') || { echo "pip_test: FAILED: the module with $label"; failed=1; }
import sys, tiermem
assert tiermem.__file__.startswith(sys.prefix), f"imported {tiermem.__file__}, not the venv's"
assert tiermem.__version__ == sys.argv[1], f"tiermem.__version__ {tiermem.__version__}, library {sys.argv[1]}"
with tiermem.connect() as c:
    a = c.alloc(1 << 16, tier="dram")
    c.write(a.gva, b"from pip")
    assert bytes(c.read(a.gva, 8)) == b"from pip"
    a.free()
print(f"  tiermem {tiermem.__version__} from {tiermem.__file__}: alloc, write, read, free")
PY
done
[ "$failed" -eq 0 ] && echo "pip_test: all passed"
exit "$failed"
