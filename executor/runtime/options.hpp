// What a training job is asked to do (the command line, tiermem-exec.cpp)
// and the test hooks, at the bottom of the runtime: every part of it reads
// its options from here, and nothing below the trainer includes trainer.hpp.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>

namespace tiermem::exec {

// Fault injection and test switches: read from the environment once, at the
// start (read_runtime_hooks, called by tiermem-exec's main), and passed down
// in TrainOptions::hooks; nothing in the runtime reads the environment for
// them where they act.
struct RuntimeHooks {
  // A real SIGSTOP of the rank at a chosen step (-1: never), where a death
  // is hardest to resume from (tests/executor):
  int64_t stop_after_commit = -1;   // TIERMEM_EXEC_STOP_AFTER_COMMIT: step committed, barrier not raised
  int64_t stop_in_snapshot = -1;    // TIERMEM_EXEC_STOP_IN_SNAPSHOT: its snapshot sent, not known whole
  int64_t stop_before_commit = -1;  // TIERMEM_EXEC_STOP_BEFORE_COMMIT: all-reduced and updated, not committed
  bool stop_in_move = false;        // TIERMEM_EXEC_STOP_IN_MOVE: after the first tensor of a re-plan's move
  // TIERMEM_EXEC_CPU_BUCKETS=1: CPU ranks reduce gradients bucket by bucket
  // through the memory service (bucket_collective.hpp), as NCCL does on GPUs.
  bool cpu_buckets = false;
};

// The hooks the environment sets now.
RuntimeHooks read_runtime_hooks();

// Runtime repartitioning (X11, replan.hpp): when rank 0 sees the job stay
// slow - the step time's P99 over `p99_ms` and a node's CPU over
// `cpu_percent`, in `patience` looks `every_ms` apart - and a cut by the
// stages' measured speed predicts a slowest stage at least `min_gain`
// faster, every rank moves to that cut at the next step boundary.
struct ReplanOptions {
  bool enabled = false;
  int every_ms = 500;
  double p99_ms = 200;
  double cpu_percent = 85;
  double min_gain = 0.2;
  int patience = 2;
};

struct TrainOptions {
  RuntimeHooks hooks;
  std::string model;
  std::string job = "tiermem-job";
  std::string socket;            // empty: $TIERMEM_SOCKET or the default
  std::string device = "cpu";    // where the kernels run: cpu, cuda, cuda:N (compute.hpp)
  std::string precision = "fp32";  // of the GEMMs: fp32, or bf16 (GPUs; Compute::set_precision)
  bool graphs = true;            // on a GPU, capture a step once and replay it (stages without messages)
  int stages = 0;                // pipeline stages; 0: one per rank (per tensor-parallel group)
  int tensor_parallel = 1;       // ranks sharing each split block (tensor_parallel.hpp)
  int micro_batches = 2;
  // The order of a step's micro-batches (memory_plan.hpp): "gpipe" (every
  // forward, then every backward) or "1f1b" (at most the stages after this
  // one plus one micro-batches' activations at once; the same bits).
  std::string schedule = "gpipe";
  // > 1: activation checkpointing over this many segments of the forward
  // pass (autodiff.cpp; one stage only, for now).
  int checkpoint = 0;
  // How data-parallel gradients and tensor-parallel sums are reduced
  // (collectives.hpp): "auto" (NCCL where every member of a group is a GPU
  // rank), "nccl" (an error where it cannot be), "tiermem".
  std::string collectives = "auto";
  int64_t bucket_bytes = 25 << 20;  // gradient buckets all-reduced beside the backward pass (NCCL)
  // How the stages are cut (partitioner.hpp): "flops" (METIS, FLOP- and
  // memory-balanced), "time" (by each stage's measured device and link),
  // "auto" (time when the stages' devices differ).
  std::string balance = "auto";
  // > 1: every kernel of this (CPU) rank takes this many times as long
  // (slowdown.hpp): an emulated slower device.
  double slowdown = 1;
  int64_t slowdown_from = 0;  // the step the slowdown starts at (0: from the start, calibration too)
  ReplanOptions replan;
  // Bytes of the tier the kernels compute in (VRAM on a GPU, DRAM on the
  // CPU) for this rank's tensors; 0: no limit. What does not fit is
  // offloaded (memory_plan.hpp): parameters, gradients and optimizer state
  // one tier down, streamed through a window.
  int64_t budget = 0;
  // Offloaded: where the optimizer runs. device: on the compute through the
  // window (the kernels of a run that fits: its very bits); host: on the
  // host over the home tier (the CPU's Adam, ZeRO-Offload's way); automatic:
  // per parameter, where the step is shortest by the rates measured in the
  // first step (update_split.hpp), or `host_share` of the parameters on the
  // host when that is >= 0.
  enum class OffloadUpdate { device, host, automatic };
  OffloadUpdate offload_update = OffloadUpdate::device;
  double host_share = -1;
  int epochs = 3;
  int64_t steps = 0;             // > 0: stop after this many steps instead
  uint64_t seed = 1;
  bool shuffle = true;
  std::string data;              // dataset path override
  std::string trace;             // Chrome trace file (".rankN" added when world > 1)
  std::string losses;            // per-step losses, hex floats, one per line
  std::string dump;              // directory for initial parameters and batches
  int dump_batches = 0;
  int log_every = 0;             // steps between progress lines; 0: per epoch
  int64_t snapshot_every = 0;    // > 0: copy the committed state to PMEM every this many steps
  uint32_t replicas = 0;         // > 0: that state, every step, also on this many other nodes (see Arenas)
  std::chrono::milliseconds timeout{120000};
  bool quiet = false;
  bool split = true;             // split a matmul too heavy to balance the stages into column blocks
  bool keep = false;             // leave the job's memory in tiermem when it ends (freed by default)
  bool restart = false;          // free this rank's memory of an earlier run first, start at step 0
};

}  // namespace tiermem::exec
