#!/usr/bin/env bash
# The host's Adam (executor/host_adam.hpp, issue 50) in parameters per
# second: bench/host_adam_bench's plain scalar loop (the baseline), the
# vectorised loop on one thread, OpenMP's threads (every CPU rank) and the
# pinned pool (an offloaded GPU rank's optimizer); then PyTorch's CPU AdamW
# over the same number of fp32 parameters in one tensor (fused where this
# PyTorch has it, else foreach), same machine, same run. Goal (issue 50):
# host_adam_pool_params_per_s >= 1e9 on the GPU machine's 16 cores.
# Usage: bench/host_adam.sh BUILD_DIR [PARAMS]
set -euo pipefail
build=${1:?usage: bench/host_adam.sh BUILD_DIR [PARAMS]}
params=${2:-33554432}
out=$("$build/bench/host_adam_bench" --params "$params" --trials 7)
echo "$out"
pool=$(sed -n 's/^host_adam_pool_params_per_s \([0-9.e+]*\) .*/\1/p' <<<"$out")
py=python3  # the first Python with torch: the GPU machine's, else Debian's
python3 -c 'import torch' 2>/dev/null || py=/usr/bin/python3
torch=$("$py" - "$params" <<'PY' 2>/dev/null || true
import os, sys, time, torch
torch.set_num_threads(len(os.sched_getaffinity(0)))  # every CPU, as the pool has
n = int(sys.argv[1])
p = torch.nn.Parameter(torch.full((n,), 0.01))
p.grad = (torch.arange(n) % 2001 - 1000).float() * 1e-5
how = "foreach"
try:
    opt = torch.optim.AdamW([p], lr=3e-4, weight_decay=0.1, fused=True)
    opt.step()
    how = "fused"
except Exception:
    opt = torch.optim.AdamW([p], lr=3e-4, weight_decay=0.1, foreach=True)
    opt.step()
times = []
for _ in range(7):
    t = time.perf_counter()
    opt.step()
    times.append(time.perf_counter() - t)
times.sort()
print(f"{n / times[3]:.4g} {how} {torch.__version__} {torch.get_num_threads()}")
PY
)
if [ -n "$torch" ]; then
  read -r rate how version threads <<<"$torch"
  echo "# PyTorch $version AdamW ($how) on $threads threads"
  echo "torch_adamw_params_per_s $rate params/s"
  awk -v a="$pool" -v b="$rate" 'BEGIN { printf "host_adam_pool_vs_torch_ratio %.3f\n", a / b }'
else
  echo "# PyTorch not importable: no torch_adamw figure"
fi
