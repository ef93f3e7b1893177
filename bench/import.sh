#!/usr/bin/env bash
# An imported model against the same model written our way (issue 48: the
# importer's patterns keep the fast paths). nanoGPT's model.py as published
# (tests/python/models/nanogpt_model.py) at the size of
# config/models/gpt_tiny.pbtxt (2 blocks of 64, 4 heads, context 32, MLP 256,
# biases, bytes as tokens, 8 sequences a micro-batch) is exported by
# tiermem.fx and trained beside gpt_tiny itself, alternating, ROUNDS rounds
# (default 7) of STEPS steps each: the median over rounds of each run's
# median step, and
# import_nanogpt_vs_ours_ratio = ours / imported (goal >= 0.95: within 5 %).
# The two differ only where nanoGPT does (exact GELU, a tied head read
# transposed). Then a Llama in Hugging Face's form of the same width
# (RMSNorm, rotary positions, grouped-query attention, SwiGLU), reported.
# Usage: bench/import.sh BUILD_DIR [--device cuda] [STEPS]
set -euo pipefail
build=${1:?usage: bench/import.sh BUILD_DIR [--device cuda] [STEPS]}
shift
device=(--device cpu)
if [ "${1:-}" = "--device" ]; then device=(--device "$2"); shift 2; fi
steps=${1:-300}
top=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
export TIERMEM_CLUSTER_DIR=$(mktemp -d /tmp/tiermem-bench-XXXXXX)
export TIERMEM_BASE_PORT=$((21000 + RANDOM % 20000))
trap '"$top/tools/local-cluster.sh" stop >/dev/null 2>&1; rm -rf "$TIERMEM_CLUSTER_DIR"' EXIT
"$top/tools/local-cluster.sh" start "$build" 1 >/dev/null
out=$TIERMEM_CLUSTER_DIR/models
mkdir -p "$out"

# The tiermem package: the build tree's (elsewhere: TIERMEM_PYTHONPATH, e.g.
# a device pack's py/pkg) and the Python with torch (PYTHON).
PYTHONPATH=${TIERMEM_PYTHONPATH:-$build/client/python}:$top/tests/python/models ${PYTHON:-/usr/bin/python3} - "$out" <<'PY' >/dev/null
import sys, torch, tiermem.fx
from nanogpt_model import GPT, GPTConfig
from llama_style import LlamaForCausalLM
out = sys.argv[1]
torch.manual_seed(1)
ids = torch.zeros(8, 32, dtype=torch.long)
opt = {"type": "ADAM", "learning_rate": 3e-3}
tiermem.fx.export(GPT(GPTConfig(block_size=32, vocab_size=256, n_layer=2, n_head=4, n_embd=64, dropout=0.0,
                                bias=True)), (ids, ids), f"{out}/nanogpt.pbtxt", dataset="text:fortunes", optimizer=opt)
tiermem.fx.export(LlamaForCausalLM(vocab_size=256, hidden_size=64, intermediate_size=256, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=2), (ids, ids), f"{out}/llama.pbtxt",
                  dataset="text:fortunes", optimizer=opt)
PY

median_step() {  # MODEL: the median step (ms) of one run
  TIERMEM_SOCKET=$TIERMEM_CLUSTER_DIR/node1/tiermemd.sock "$build/executor/tiermem-exec" train "$1" \
    --job "import$RANDOM" --steps "$steps" --micro-batches 1 --log-every 100000 \
    --data "$top/tests/data/corpus.txt" "${device[@]}" | sed -n 's/^summary: .*(median \([0-9.]*\) ms).*/\1/p'
}
rounds=${ROUNDS:-7}
ours=() imported=() llama=()
for round in $(seq 1 "$rounds"); do
  ours+=("$(median_step "$top/config/models/gpt_tiny.pbtxt")")
  imported+=("$(median_step "$out/nanogpt.pbtxt")")
  llama+=("$(median_step "$out/llama.pbtxt")")
done
median() { printf '%s\n' "$@" | sort -g | sed -n "$((($# + 1) / 2))p"; }
o=$(median "${ours[@]}") i=$(median "${imported[@]}") l=$(median "${llama[@]}")
echo "# ${device[*]}, $steps steps, $rounds rounds alternating (ours: ${ours[*]}; imported: ${imported[*]}; llama: ${llama[*]})"
echo "ours_gpt_tiny_step_ms $o ms"
echo "import_nanogpt_step_ms $i ms"
echo "import_llama_step_ms $l ms"
awk -v o="$o" -v i="$i" 'BEGIN { printf "import_nanogpt_vs_ours_ratio %.3f\n", o / i }'
