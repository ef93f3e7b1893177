#!/usr/bin/env bash
# The GPU on a real GPU (run where one is: the device machine; prints a note
# and nothing else elsewhere). Usage: bench/gpu.sh BUILD_DIR. Binaries
# carried to a machine without the build's libraries need LD_LIBRARY_PATH
# (and UCX_MODULE_DIR) set by the caller; $TIERMEM_FASHION points at
# Fashion-MNIST where Debian's package is not installed.
#
# 1. build/bench/gpu_bench: VRAM writes and reads through libtiermem from
#    pageable, pinned and device buffers, and migration, against cudaMemcpy.
# 2. Step time of `tiermem-exec train --device cuda --micro-batches 1` (the step replayed as a
#    CUDA graph, and --no-graphs) against PyTorch eager and PyTorch's own
#    graph replay (bench/torch_gpu_step.py), same model, batch and fp32
#    without TF32, on three models of bench/models: an SGD MLP and an Adam
#    MLP at batch 128 (launch-bound) and a 4096-wide Adam MLP at batch 1024
#    (GEMM-bound, with its TFLOP/s against a 4096^3 sgemm alone).
#    Goals: exec_<model>_vs_torch_graph_ratio <= 1.0.
# 3. The same for the GPT of config/models/gpt_tiny.pbtxt (2 blocks of 64,
#    4 heads, context 32, bytes as tokens; 8 sequences a step) in fp32
#    against the same module in PyTorch (bench/torch_gpt_step.py), on the
#    repository's docs as its corpus ($TIERMEM_CORPUS overrides).
# 4. bf16: see its section.
# 5. Offload (--vram-budget): see the section at the end. GPU_BENCH_ONLY=offload
#    runs only gpu_bench and that section.
# 6. Device-aware partitioning (issue 32): one GPU rank and three CPU ranks
#    train one pipeline, cut by FLOPs and by time; see balance_section.
#    GPU_BENCH_ONLY=balance runs only gpu_bench and that section.
# 7. Several GPUs (issue 25; skipped with one): raw ncclAllReduce
#    (build/bench/nccl_bench) against the executor's data-parallel
#    all-reduce, and the step on 2 GPUs against 1; see nccl_section.
#    GPU_BENCH_ONLY=nccl runs only gpu_bench and that section.
# 8. GPTs as users write them (issue 49), bf16 against PyTorch eager and
#    torch.compile: see gpt_section. GPU_BENCH_ONLY=gpt runs only it.
set -euo pipefail
build=${1:?usage: bench/gpu.sh BUILD_DIR}
build=$(cd "$build" && pwd)
top=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
export TIERMEMD=${TIERMEMD:-$build/daemon/tiermemd}
if [ ! -x "$build/bench/gpu_bench" ]; then
  echo "# gpu: not built (no CUDA found at configure time)"
  exit 0
fi
gpu_lines=$("$build/bench/gpu_bench")
echo "$gpu_lines"

exec=${TIERMEM_EXEC:-$build/executor/tiermem-exec}
# Sections 5 and 6 alone need no PyTorch.
if [ ! -x "$exec" ] || { [ "${GPU_BENCH_ONLY:-}" != offload ] && [ "${GPU_BENCH_ONLY:-}" != balance ] &&
                         [ "${GPU_BENCH_ONLY:-}" != nccl ] &&
                         ! python3 -c 'import torch; assert torch.cuda.is_available()' 2>/dev/null; }; then
  echo "# gpu training: tiermem-exec or PyTorch with CUDA missing, skipped"
  exit 0
fi
steps=${GPU_BENCH_STEPS:-300}
export TIERMEM_CLUSTER_DIR=$(mktemp -d /tmp/tiermem-gpubench-XXXXXX)
# DRAM: an offloaded rank keeps its parameters, gradients and Adam's state there (section 5).
export TIERMEM_BASE_PORT=$((21000 + RANDOM % 20000)) TIERMEM_VRAM=${TIERMEM_VRAM:-16GiB} TIERMEM_DRAM=${TIERMEM_DRAM:-8GiB}
trap '"$top/tools/local-cluster.sh" stop >/dev/null 2>&1; rm -rf "$TIERMEM_CLUSTER_DIR"' EXIT
"$top/tools/local-cluster.sh" start "$build" 1 >/dev/null
export TIERMEM_SOCKET=$TIERMEM_CLUSTER_DIR/node1/tiermemd.sock
median() { sed -n 's/^summary: .*(median \([0-9.]*\) ms).*/\1/p'; }
value() { awk -v k="$1" '$1 == k { print $2 }'; }
# exec_model TAG MODEL [ARGS]: median step of tiermem-exec, graphs and not.
exec_model() {
  local tag=$1 model=$top/bench/models/$2.pbtxt data=()
  [ -e "$model" ] || model=$top/config/models/$2.pbtxt
  shift 2
  grep -q fashion-mnist "$model" && [ -n "${TIERMEM_FASHION:-}" ] && data=(--data "$TIERMEM_FASHION")
  grep -q '"text:' "$model" && data=(--data "${TIERMEM_CORPUS:-$top/tests/data/corpus.txt}")
  local g l
  g=$("$exec" train "$model" --job "g-$tag" --device cuda --steps "$steps" --micro-batches 1 --log-every 100000 "${data[@]}" "$@" | median)
  l=$("$exec" train "$model" --job "l-$tag" --device cuda --steps "$steps" --micro-batches 1 --log-every 100000 --no-graphs \
    "${data[@]}" "$@" | median)
  echo "exec_${tag}_graph_step_ms_median $g ms"
  echo "exec_${tag}_launched_step_ms_median $l ms"
}
report() {  # report TAG: ratios against PyTorch from the lines before
  local tag=$1 lines=$2
  local g e tg te
  g=$(value "exec_${tag}_graph_step_ms_median" <<<"$lines")
  tg=$(value "torch_${tag}_graph_step_ms_median" <<<"$lines")
  te=$(value "torch_${tag}_eager_step_ms_median" <<<"$lines")
  awk -v a="$g" -v b="$tg" -v t="$tag" 'BEGIN { printf "exec_%s_vs_torch_graph_ratio %.3f\n", t, a / b }'
  awk -v a="$g" -v b="$te" -v t="$tag" 'BEGIN { printf "exec_%s_vs_torch_eager_ratio %.3f\n", t, a / b }'
}
# mlp_tflops TAG BATCH FIRST_WIDTH BASELINE_KEY RATIO_NAME LINES: the TFLOP/s
# of the 4096-wide MLP's step (three GEMMs per layer but the first layer's
# input gradient) and its ratio to the GEMM alone under BASELINE_KEY.
mlp_tflops() {
  local tag=$1 batch=$2 first=$3 key=$4 ratio=$5 lines=$6
  awk -v ms="$(value "exec_${tag}_graph_step_ms_median" <<<"$lines")" -v s="$(value "$key" <<<"$lines")" \
      -v b="$batch" -v k1="$first" -v t="$tag" -v r="$ratio" 'BEGIN {
    split("4096 4096 4096 10", n, " "); split(k1 " 4096 4096 4096", k, " "); f = 0
    for (i = 1; i <= 4; ++i) { f += (i == 1 ? 2 : 3) * 2 * b * k[i] * n[i] }
    printf "exec_%s_tflops %.4g TFLOP/s\n", t, f / (ms * 1e-3) / 1e12
    printf "exec_%s_%s %.3f\n", t, r, f / (ms * 1e-3) / 1e12 / s }'
}
offload_section() {
  # 5. Offload: bench/models/gpt_offload.pbtxt (12 x 1024, 152 M parameters,
  #    GEMM-bound) with a VRAM budget of a third of its fp32 state (the two
  #    parameter copies, gradients and Adam's two copies: 4.0 GiB), against
  #    the same model all in VRAM; the optimizer placements (--offload-update
  #    device: chunks through the window, the kernels of the run that fits;
  #    host: the CPU's Adam over the DRAM tier, ZeRO-Offload's; auto: per
  #    parameter by the measured rates, its reason printed). Prints:
  #    offload_<update>_vs_all_in_vram_ratio = all-in step / offloaded step
  #    (goal >= 0.7); TFLOP/s of each (6 x parameters x tokens per step);
  #    the copies' bytes per step, their time at cudaMemcpy's pinned rate
  #    (gpu_bench's 64 MiB figure, both directions), and the part of it hidden
  #    behind compute: 1 - (offloaded - all-in) / that time; the bound
  #    max(all-in step, that time) and the offloaded step against it (goal
  #    <= 1.15: the transfers and the optimizer hidden).
  #    OFFLOAD_UPDATES="host" (or "device", "auto") runs those placements only.
  local model=$top/bench/models/gpt_offload.pbtxt mb=${OFFLOAD_MICRO_BATCHES:-4} n=${OFFLOAD_STEPS:-30}
  local corpus=${TIERMEM_CORPUS:-$top/tests/data/corpus.txt}
  local state budget all_out
  state=$("$exec" plan "$model" --device cuda --micro-batches "$mb" |
    awk '/arena (params|grads|optimizer)/ { v = $4; u = $5; m = $6; sub("x", "", m)
           f = (u == "GiB" ? 1024 : u == "KiB" ? 1 / 1024 : 1); s += v * f * m } END { printf "%d", s }')
  budget=$((state / 3))MiB
  "$exec" plan "$model" --device cuda --micro-batches "$mb" --vram-budget "$budget" | grep -E '^  (arena|peak|budget|offload)'
  all_out=$("$exec" train "$model" --job off-all --device cuda --steps "$n" --micro-batches "$mb" --log-every 100000 \
    --data "$corpus" --no-graphs)
  local all tokens params pinned_up pinned_down
  all=$(median <<<"$all_out")
  tokens=$(awk '/^tensor \{ name: "ids"/ { gsub(/[^0-9]/, "", $6); print $6 }' "$model")
  params=$("$exec" plan "$model" | sed -n 's/.*ops.*, \([0-9]*\) parameters/\1/p')
  pinned_up=$(value cudaMemcpy_to_device_pinned_64MiB <<<"$gpu_lines")
  pinned_down=$(value cudaMemcpy_from_device_pinned_64MiB <<<"$gpu_lines")
  echo "offload_state_mib $state MiB"
  echo "offload_budget_mib ${budget%MiB} MiB"
  echo "offload_all_in_vram_step_ms_median $all ms"
  awk -v ms="$all" -v p="$params" -v t="$tokens" -v m="$mb" \
    'BEGIN { printf "offload_all_in_vram_tflops %.4g TFLOP/s\n", 6 * p * t * m / (ms * 1e-3) / 1e12 }'
  local where out off loaded drained
  for where in ${OFFLOAD_UPDATES:-device host auto}; do
    out=$("$exec" train "$model" --job "off-$where" --device cuda --steps "$n" --micro-batches "$mb" --log-every 100000 \
      --data "$corpus" --vram-budget "$budget" --offload-update "$where")
    off=$(median <<<"$out")
    loaded=$(sed -n 's/^offload: \([0-9.]*\) \([KMG]\)iB loaded.*/\1 \2/p' <<<"$out")
    drained=$(sed -n 's/.*loaded and \([0-9.]*\) \([KMG]\)iB drained.*/\1 \2/p' <<<"$out")
    echo "offload_${where}_step_ms_median $off ms"
    # auto: the rank's choice and why, as a comment line.
    grep -m1 'the optimizer where the step is shortest' <<<"$out" | sed 's/^/# /' || true
    awk -v a="$all" -v o="$off" -v w="$where" -v p="$params" -v t="$tokens" -v m="$mb" -v l="$loaded" -v d="$drained" \
        -v up="$pinned_up" -v down="$pinned_down" 'function bytes(s,  x) { split(s, x, " ")
          return x[1] * (x[2] == "G" ? 2^30 : x[2] == "M" ? 2^20 : 2^10) }
      BEGIN {
        printf "offload_%s_tflops %.4g TFLOP/s\n", w, 6 * p * t * m / (o * 1e-3) / 1e12
        printf "offload_%s_bytes_per_step %.4g GB\n", w, (bytes(l) + bytes(d)) / 1e9
        if (up > 0 && down > 0) {
          copy = bytes(l) / (up * 1e9) * 1e3 + bytes(d) / (down * 1e9) * 1e3
          printf "offload_%s_copy_ms_at_pinned_rate %.4g ms\n", w, copy
          printf "offload_%s_hidden_fraction %.3f\n", w, 1 - (o - a) / copy
          bound = a > copy ? a : copy
          printf "offload_%s_bound_ms %.4g ms\n", w, bound
          printf "offload_%s_vs_bound_ratio %.3f\n", w, o / bound
        }
        printf "offload_%s_vs_all_in_vram_ratio %.3f\n", w, a / o }'
  done
}
balance_section() {
  # 6. A mixed mesh: rank 0 on the GPU (stage 0), ranks 1-3 on the host's
  #    cores (a quarter each), one pipeline of $BALANCE_MODEL (default
  #    config/models/gpt_tiny.pbtxt, whole ops) over the one daemon:
  #    --balance flops (METIS's even FLOPs) against --balance auto (each
  #    rank's measured device: by time), and the GPU rank alone. Prints
  #    balance_mixed_<how>_step_ms_median, balance_mixed_time_vs_flops_ratio
  #    (goal <= 0.5) and balance_mixed_time_vs_gpu_alone_ratio.
  local model=${BALANCE_MODEL:-$top/config/models/gpt_tiny.pbtxt} n=${BALANCE_STEPS:-100}
  local corpus=${TIERMEM_CORPUS:-$top/tests/data/corpus.txt}
  mixed() {  # mixed NAME ARGS: the median step of one run of the four ranks
    local name=$1 r device
    shift
    for r in 0 1 2 3; do
      device=cpu
      [ $r -eq 0 ] && device=cuda
      TIERMEM_RANK=$r TIERMEM_WORLD_SIZE=4 TIERMEM_LOCAL_WORLD_SIZE=4 \
        "$exec" train "$model" --job "$name" --device $device --steps "$n" --log-every 100000 --data "$corpus" \
        --no-split "$@" >"$TIERMEM_CLUSTER_DIR/$name.rank$r.log" 2>&1 &
    done
    wait
    cat "$TIERMEM_CLUSTER_DIR/$name".rank*.log | median
  }
  local flops by_time alone
  flops=$(mixed mix-flops --balance flops)
  by_time=$(mixed mix-time --balance auto)
  grep -h -E '^(partition by|  stage |rank [0-9]: (stage|.*GEMMs))' "$TIERMEM_CLUSTER_DIR"/mix-time.rank*.log | sed 's/^/# /'
  alone=$("$exec" train "$model" --job mix-alone --device cuda --steps "$n" --log-every 100000 --data "$corpus" \
    --no-split | median)
  echo "balance_mixed_flops_step_ms_median $flops ms"
  echo "balance_mixed_time_step_ms_median $by_time ms"
  echo "balance_gpu_alone_step_ms_median $alone ms"
  awk -v t="$by_time" -v f="$flops" -v a="$alone" 'BEGIN { if (t > 0 && f > 0 && a > 0) {
    printf "balance_mixed_time_vs_flops_ratio %.3f\n", t / f
    printf "balance_mixed_time_vs_gpu_alone_ratio %.3f\n", t / a } }'
}
nccl_section() {
  # 7. Two GPUs, a daemon on each (TIERMEM_VRAM_DEVICES=0,1), two
  #    data-parallel ranks of $NCCL_MODEL (default bench/models/gpt_medium:
  #    4 x 512, 16 sequences of 128, GEMM-bound), 4 micro-batches each,
  #    gradients all-reduced through NCCL in $NCCL_BUCKET_MIB (25) MiB
  #    buckets beside the backward pass. Prints
  #    - nccl_allreduce_<bytes>_busbw (raw, one process over both GPUs) at
  #      the bucket size and the whole gradient size;
  #    - nccl_exec_allreduce_busbw: the ranks' own (the group's stream timed
  #      by CUDA events; it includes waiting for the slower rank);
  #    - nccl_exec_vs_raw_busbw_ratio (goal >= 0.9);
  #    - nccl_dp_{1,2}gpu_step_ms_median and nccl_dp_scaling_efficiency:
  #      the step of one GPU with 4 micro-batches over the step of each of
  #      two GPUs with 4 micro-batches each (weak scaling: the global batch
  #      doubles; goal >= 0.9), both launched (a data-parallel step is not
  #      replayed), and the one-GPU step replayed for reference.
  local gpus
  gpus=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | wc -l)
  if [ "$gpus" -lt 2 ] || [ ! -x "$build/bench/nccl_bench" ]; then
    echo "# nccl: $gpus GPU(s) or no nccl_bench: section 7 skipped"
    return 0
  fi
  local model=${NCCL_MODEL:-$top/bench/models/gpt_medium.pbtxt} n=${NCCL_STEPS:-100} mib=${NCCL_BUCKET_MIB:-25}
  local corpus=${TIERMEM_CORPUS:-$top/tests/data/corpus.txt}
  "$top/tools/local-cluster.sh" stop >/dev/null 2>&1 || true
  TIERMEM_VRAM_DEVICES=0,1 "$top/tools/local-cluster.sh" start "$build" 2 >/dev/null
  local one one_graph two r
  one=$("$exec" train "$model" --job nccl-one --device cuda:0 --steps "$n" --micro-batches 4 --no-graphs \
    --log-every 100000 --data "$corpus" | median)
  one_graph=$("$exec" train "$model" --job nccl-one-g --device cuda:0 --steps "$n" --micro-batches 4 \
    --log-every 100000 --data "$corpus" | median)
  for r in 0 1; do
    TIERMEM_RANK=$r TIERMEM_WORLD_SIZE=2 TIERMEM_SOCKET=$TIERMEM_CLUSTER_DIR/node$((r + 1))/tiermemd.sock \
      "$exec" train "$model" --job nccl-two --device cuda:$r --stages 1 --steps "$n" --micro-batches 4 \
      --bucket-mib "$mib" --log-every 100000 --data "$corpus" >"$TIERMEM_CLUSTER_DIR/nccl-two.rank$r.log" 2>&1 &
  done
  wait
  grep -h -E 'NCCL|bus bandwidth' "$TIERMEM_CLUSTER_DIR"/nccl-two.rank*.log | sed 's/^/# /'
  two=$(median <"$TIERMEM_CLUSTER_DIR/nccl-two.rank0.log")
  local grads exec_bus raw
  grads=$(sed -n 's/.*all-reduce through NCCL [0-9.]*: \([0-9.]*\) MB in .*/\1/p' "$TIERMEM_CLUSTER_DIR/nccl-two.rank0.log" |
    awk -v n="$n" '{ printf "%d", $1 * 1e6 / n }')
  exec_bus=$(sed -n 's/.*bus bandwidth \([0-9.]*\) GB\/s.*/\1/p' "$TIERMEM_CLUSTER_DIR"/nccl-two.rank*.log | sort -n | tail -1)
  local raw_lines
  raw_lines=$("$build/bench/nccl_bench" $((mib << 20)) ${grads:+"$grads"})
  echo "$raw_lines"
  raw=$(value "nccl_allreduce_$((mib << 20))_busbw" <<<"$raw_lines")
  echo "nccl_dp_1gpu_step_ms_median $one ms"
  echo "nccl_dp_1gpu_replayed_step_ms_median $one_graph ms"
  echo "nccl_dp_2gpu_step_ms_median $two ms"
  echo "nccl_exec_allreduce_busbw ${exec_bus:-0} GB/s"
  awk -v e="${exec_bus:-0}" -v r="${raw:-0}" -v a="$one" -v b="$two" -v g="$one_graph" 'BEGIN {
    if (r > 0) printf "nccl_exec_vs_raw_busbw_ratio %.3f\n", e / r
    if (a > 0 && b > 0) printf "nccl_dp_scaling_efficiency %.3f\n", a / b
    if (g > 0 && b > 0) printf "nccl_dp_scaling_vs_replayed_ratio %.3f\n", g / b }'
}
if [ "${GPU_BENCH_ONLY:-}" = nccl ]; then
  nccl_section
  exit 0
fi
# 8. GPTs as users write them (issue 49): nanoGPT's model.py exported at
#    nanoGPT's character-level recipe size (6 x 384, 6 heads, context 256,
#    64 sequences, no bias, dropout 0), and GPT-2 small's width (12 x 768,
#    vocabulary 50304) at context 256 (16 sequences) and 1024 (8), trained
#    with --precision bf16 against PyTorch's autocast-bf16 step with fused
#    AdamW, eager and under torch.compile (bench/torch_nanogpt_step.py): the
#    median steps, TFLOP/s by nanoGPT's estimate_mfu and
#    exec_<tag>_vs_torch_best_ratio (goal <= 1.0); then the first size's
#    bf16 losses against fp32's (goal within 2e-2). GPT_SIZES picks sizes
#    (default: all); GPT_STEPS the steps (default 60); GPT_DIR keeps the
#    exported models (default: a temporary directory). GPU_BENCH_ONLY=gpt
#    runs only gpu_bench and this section; TIERMEM_FLASH=0 runs attention
#    as batched GEMMs instead of in tiles. tiermem.fx is the build's (or
#    $TIERMEM_PYTHONPATH's: a device pack's py/pkg).
gpt_section() {
  local n=${GPT_STEPS:-60} dir=${GPT_DIR:-$TIERMEM_CLUSTER_DIR/gpt} spec
  mkdir -p "$dir"
  echo "# GPTs as users write them, bf16, $n steps, medians, $(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)"
  for spec in ${GPT_SIZES:-char:6:6:384:256:64:256 gpt2s_256:12:12:768:256:16:50304 gpt2s_1024:12:12:768:1024:8:50304}; do
    local tag layers heads width context seqs vocab lines flops e c best g run
    IFS=: read -r tag layers heads width context seqs vocab <<<"$spec"
    lines=$(PYTHONPATH=${TIERMEM_PYTHONPATH:-$build/client/python} python3 "$top/bench/torch_nanogpt_step.py" \
      "$tag" "$layers" "$heads" "$width" "$context" "$seqs" "$vocab" "$n" "$dir/$tag.pbtxt" 2>&1 |
      grep -E '^(torch_|nanogpt_|# )') || true
    echo "$lines"
    [ -e "$dir/$tag.pbtxt" ] || { echo "# $tag: export failed"; continue; }
    run=$("$exec" train "$dir/$tag.pbtxt" --job "gpt-$tag" --device cuda --precision bf16 --steps "$n" --micro-batches 1 \
        --log-every 100000 --data "${TIERMEM_CORPUS:-$top/tests/data/corpus.txt}" 2>&1) || echo "# $tag: $(tail -2 <<<"$run")"
    g=$(median <<<"$run")
    echo "exec_${tag}_bf16_graph_step_ms_median $g ms"
    # The plan's memory (tensors in the VRAM tier; cuBLAS's workspace and
    # the kernels' scratch come on top) against PyTorch's peak allocation.
    sed -n 's/^stage 0: \([0-9.]*\) \([KMG]\)iB in tiermem.*/exec_'"$tag"'_planned_vram \1 \2iB/p' <<<"$run"
    flops=$(value "nanogpt_${tag}_flops_per_step" <<<"$lines")
    e=$(value "torch_${tag}_eager_step_ms_median" <<<"$lines")
    c=$(value "torch_${tag}_compile_step_ms_median" <<<"$lines")
    best=$(printf '%s\n' $e $c | sort -g | head -1)
    awk -v f="$flops" -v g="$g" -v e="$e" -v c="$c" -v b="$best" -v t="$tag" 'BEGIN {
      printf "exec_%s_bf16_tflops %.1f TFLOP/s\n", t, f / g / 1e9
      if (e != "") printf "torch_%s_eager_tflops %.1f TFLOP/s\n", t, f / e / 1e9
      if (c != "") printf "torch_%s_compile_tflops %.1f TFLOP/s\n", t, f / c / 1e9
      if (b != "") printf "exec_%s_vs_torch_best_ratio %.3f (goal <= 1.0)\n", t, g / b
      printf "exec_%s_mfu %.3f (of 989 TFLOP/s)\n", t, f / g / 1e9 / 989 }'
  done
  # bf16 against fp32 over GPT_LOSS_STEPS steps (default 200) of the first
  # size, same seed and batches: the largest relative difference of a loss
  # (goal <= 2e-2).
  local first=${GPT_SIZES:-char} ls=${GPT_LOSS_STEPS:-200} p
  first=${first%%:*}
  [ -e "$dir/$first.pbtxt" ] || return 0
  for p in fp32 bf16; do
    "$exec" train "$dir/$first.pbtxt" --job "gpt-loss-$p" --device cuda --precision $p --steps "$ls" --micro-batches 1 \
      --log-every 100000 --seed 3 --losses "$dir/$first.$p.losses" -q \
      --data "${TIERMEM_CORPUS:-$top/tests/data/corpus.txt}" >/dev/null 2>&1 || echo "# $first $p: the loss run failed"
  done
  # Beside it, the mean over the last quarter of the steps: an early loss
  # spike (both precisions spike, by different amounts) sets the worst.
  # (Hex floats: read by Python, as mawk reads them and gawk does not.)
  python3 - "$dir/$first.fp32.losses" "$dir/$first.bf16.losses" "$first" "$ls" <<'PY' 2>/dev/null || true
import sys
a, b = ([float.fromhex(l) for l in open(f) if l.strip()] for f in sys.argv[1:3])
t, n = sys.argv[3], sys.argv[4]
rel = [abs(x - y) / abs(x) for x, y in zip(a, b)]
if rel:
    w = max(range(len(rel)), key=rel.__getitem__)
    print(f"exec_{t}_bf16_vs_fp32_worst_rel {rel[w]:.2e} (step {w + 1} of {n}; goal <= 2e-2)")
    tail = rel[len(rel) * 3 // 4:]
    print(f"exec_{t}_bf16_vs_fp32_last_quarter_mean_rel {sum(tail) / len(tail):.2e}")
PY
}
if [ "${GPU_BENCH_ONLY:-}" = gpt ]; then
  gpt_section
  exit 0
fi
if [ "${GPU_BENCH_ONLY:-}" = offload ]; then
  offload_section
  exit 0
fi
if [ "${GPU_BENCH_ONLY:-}" = balance ]; then
  balance_section
  exit 0
fi
echo "# training step time on $(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1), $steps steps, medians"
all=""
for spec in "mlp_sgd:gpu_mlp_sgd_b128:784,256,256,10:128:sgd:0.01" \
            "mlp_fashion:gpu_mlp_fashion_b128:784,256,128,10:128:adam:0.001" \
            "mlp_4096:gpu_mlp_4096:4096,4096,4096,4096,10:1024:adam:0.0001"; do
  IFS=: read -r tag model widths batch opt lr <<<"$spec"
  extra=()
  [ "$tag" = mlp_4096 ] && extra=(--sgemm)
  out=$(exec_model "$tag" "$model"; python3 "$top/bench/torch_gpu_step.py" "$tag" "$widths" "$batch" "$opt" "$lr" "$steps" "${extra[@]}")
  echo "$out"
  report "$tag" "$out"
  all+=$out$'\n'
done
mlp_tflops mlp_4096 1024 4096 torch_sgemm_4096_tflops vs_sgemm_ratio "$all"
out=$(exec_model gpt_tiny gpt_tiny; python3 "$top/bench/torch_gpt_step.py" gpt_tiny 8 2 64 4 32 256 0.003 "$steps")
echo "$out"
report gpt_tiny "$out"
# 4. Mixed precision: --precision bf16 (GEMM operands rounded to bf16, the
#    products summed in fp32; parameters, optimizer state and activations
#    fp32) against PyTorch autocast to bf16, whole step as a CUDA graph:
#    the 4096-wide MLP in TFLOP/s against a bf16 GEMM alone (goal >= 0.6;
#    at batch 1024 and 8192),
#    gpt_tiny and bench/models/gpt_medium.pbtxt (4 x 512, 8 heads, context
#    128, 16 sequences: GEMM-bound) against the graph replay (goal <= 1.0);
#    gpt_medium in fp32 as well.
out=$(exec_model mlp_4096_bf16 gpu_mlp_4096 --precision bf16
      python3 "$top/bench/torch_gpu_step.py" mlp_4096_bf16 4096,4096,4096,4096,10 1024 adam 0.0001 "$steps" --sgemm --bf16)
echo "$out"
report mlp_4096_bf16 "$out"
mlp_tflops mlp_4096_bf16 1024 4096 torch_bf16_gemm_4096_tflops vs_bf16_gemm_ratio "$out"
# The same at batch 8192, where bf16 GEMMs are most of the step.
out=$(exec_model mlp_4096_b8192_bf16 gpu_mlp_4096_b8192 --precision bf16
      python3 "$top/bench/torch_gpu_step.py" mlp_4096_b8192_bf16 512,4096,4096,4096,10 8192 adam 0.0001 "$steps" --sgemm --bf16)
echo "$out"
report mlp_4096_b8192_bf16 "$out"
mlp_tflops mlp_4096_b8192_bf16 8192 512 torch_bf16_gemm_4096_tflops vs_bf16_gemm_ratio "$out"
out=$(exec_model gpt_tiny_bf16 gpt_tiny --precision bf16
      python3 "$top/bench/torch_gpt_step.py" gpt_tiny_bf16 8 2 64 4 32 256 0.003 "$steps" --bf16)
echo "$out"
report gpt_tiny_bf16 "$out"
for precision in fp32 bf16; do
  tag=gpt_medium_$precision
  flag=()
  [ $precision = bf16 ] && flag=(--bf16)
  out=$(exec_model "$tag" gpt_medium --precision $precision
        python3 "$top/bench/torch_gpt_step.py" "$tag" 16 4 512 8 128 2048 0.0003 "$steps" "${flag[@]}")
  echo "$out"
  report "$tag" "$out"
done
gpt_section
offload_section
balance_section
nccl_section
