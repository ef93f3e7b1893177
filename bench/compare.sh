#!/usr/bin/env bash
# This build's figures against another commit's, measured in the same run:
# builds REV (default: the parent commit) in a worktree under BUILD/.compare,
# then runs each benchmark of both builds in turn, ROUNDS times (alternating,
# so drift hits both alike), and prints for every figure the median of each
# and their ratio:
#   name value unit                    (this build)
#   name_at_REV value unit             (REV)
#   name_vs_REV_ratio value            (this / REV)
# Usage: bench/compare.sh BUILD_DIR [--rev REV] [--rounds N] [NAME...]
#   names: translate local_copy control_plane (default: all three)
set -euo pipefail
build=${1:?usage: bench/compare.sh BUILD_DIR [--rev REV] [--rounds N] [NAME...]}
shift
rev=HEAD~1
rounds=5
names=()
while [ $# -gt 0 ]; do
  case $1 in
    --rev) rev=$2; shift 2 ;;
    --rounds) rounds=$2; shift 2 ;;
    *) names+=("$1"); shift ;;
  esac
done
[ ${#names[@]} -gt 0 ] || names=(translate local_copy control_plane)
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
src=$(cd "$here/.." && pwd)
build=$(cd "$build" && pwd)
short=$(git -C "$src" rev-parse --short "$rev")
base=$build/.compare/$short
if [ ! -x "$base/build/bench/translate_bench" ]; then
  echo "# building $short in $base (once)" >&2
  rm -rf "$base"
  mkdir -p "$build/.compare"
  git -C "$src" worktree prune
  git -C "$src" worktree add --detach "$base/src" "$short" >/dev/null
  # The same build type as this build, so the two differ only in code.
  buildtype=$(meson introspect --buildoptions "$build" |
    python3 -c "import json, sys; print([o['value'] for o in json.load(sys.stdin) if o['name'] == 'buildtype'][0])")
  meson setup "$base/build" "$base/src" -Dbuildtype="$buildtype" >/dev/null
  targets=(daemon/tiermemd)
  for n in "${names[@]}"; do targets+=("bench/${n}_bench"); done
  meson compile -C "$base/build" -j 2 "${targets[@]}" >&2
fi

# Runs one benchmark of one build; its figure lines, prefixed by the build.
run_one() {
  local tag=$1 dir=$2 name=$3
  TIERMEMD=$dir/daemon/tiermemd "$dir/bench/${name}_bench" 2>/dev/null |
    awk -v tag="$tag" '!/^#/ && NF >= 2 { print tag, $0 }'
}

results=$(mktemp)
trap 'rm -f "$results"' EXIT
for name in "${names[@]}"; do
  if [ ! -x "$base/build/bench/${name}_bench" ]; then
    echo "# $name: $short has no ${name}_bench; left out" >&2
    continue
  fi
  for ((r = 1; r <= rounds; r++)); do
    echo "# $name round $r/$rounds" >&2
    run_one now "$build" "$name" >> "$results"
    run_one base "$base/build" "$name" >> "$results"
  done
done

echo "# this build against $short ($(git -C "$src" log -1 --format=%s "$short" | cut -c1-60)); medians of $rounds alternating rounds"
python3 - "$results" "$short" <<'EOF'
import statistics, sys
path, short = sys.argv[1], sys.argv[2]
values, units, order = {}, {}, []
for line in open(path):
    tag, name, value, *unit = line.split()
    try:
        v = float(value)
    except ValueError:
        continue
    if name not in order:
        order.append(name)
    values.setdefault((tag, name), []).append(v)
    units[name] = unit[0] if unit else ""
for name in order:
    now, base = values.get(("now", name)), values.get(("base", name))
    if not now:
        continue
    n = statistics.median(now)
    unit = (" " + units[name]) if units[name] else ""
    print(f"{name} {n:.4g}{unit}")
    if base:
        b = statistics.median(base)
        print(f"{name}_at_{short} {b:.4g}{unit}")
        if b != 0 and not name.endswith("_ratio"):
            print(f"{name}_vs_{short}_ratio {n / b:.3f}")
EOF
