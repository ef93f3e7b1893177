// tiermem-exec: trains a partitioned graph on the tiermem memory view.
//
//   tiermem-exec train MODEL [options]      one rank (rank and world from the environment)
//   tiermem-exec plan MODEL [--stages N]    the static memory plan of every stage
//   tiermem-exec partition MODEL --parts N  cut and balance: METIS vs random vs greedy
#include <unistd.h>

#include <CLI/CLI.hpp>

#include "common/cli_man.hpp"

#include <algorithm>
#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <sstream>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include <tiermem/status_macros.h>
#include <tiermem/units.h>

#include "common/malloc_tuning.hpp"
#include "executor/graph.hpp"
#include "executor/memory_plan.hpp"
#include "executor/partitioner.hpp"
#include "executor/split.hpp"
#include "executor/runtime/env.hpp"
#include "executor/runtime/plan/job_plan.hpp"
#include "executor/runtime/control/sample.hpp"
#include "executor/runtime/control/trainer.hpp"
#include "tiermem_config.h"

namespace {


using namespace tiermem;
using namespace tiermem::exec;

// The model with its heavy ops split for `parts` stages (unless told not
// to), and its training ops.
Result<Graph> training_graph(const std::string& model, int micro_batches, int parts, bool split, int checkpoint = 0) {
  TIERMEM_ASSIGN_OR_RETURN(auto g, load_model(model));
  if (split) {
    TIERMEM_ASSIGN_OR_RETURN(auto report, split_for_balance(g, parts, micro_batches));
    for (const std::string& line : report) std::printf("%s\n", line.c_str());
    if (!report.empty()) std::printf("\n");
  }
  TIERMEM_RETURN_IF_ERROR(add_training(g, 1.0f / static_cast<float>(micro_batches), checkpoint));
  return g;
}

int fail(const Status& s) {
  std::fprintf(stderr, "tiermem-exec: %s\n", s.to_string().c_str());
  return 1;
}

// --vram-budget: a size ("6GiB", "512MiB", bytes); "" is no budget.
Result<int64_t> budget_of(const std::string& text) {
  if (text.empty()) return int64_t{0};
  auto n = parse_size(text);
  if (!n.ok() || *n == 0) {
    return Status(ErrorCode::invalid_argument,
                  "--vram-budget '" + text + "' is not a size such as 6GiB, 512MiB or a number of bytes (above 0)");
  }
  return static_cast<int64_t>(*n);
}

constexpr const char* k_budget_help =
    "bytes of the tier the kernels compute in (VRAM on a GPU, DRAM on the CPU) this rank's tensors may take, e.g. "
    "6GiB; when its parameters, gradients, optimizer state and activations do not fit, the first three live one "
    "tier down (DRAM under VRAM, PMEM under DRAM) and stream through a window (offload)";
constexpr const char* k_checkpoint_help =
    "activation checkpointing: cut the forward pass into this many segments (where the fewest activation bytes "
    "cross) and compute each segment's inner activations again in the backward pass instead of keeping them (about "
    "a third more FLOPs, the same bits; one stage only, for now). Left out, a budget that the activations do not fit "
    "even offloaded gets the fewest of 2, 4, 8, ... segments that fit; 1: never";
constexpr const char* k_schedule_help =
    "the order of a step's micro-batches: gpipe (every forward, then every backward: every micro-batch's "
    "activations at once) or 1f1b (one backward after each forward once the pipeline is full: a stage keeps at most "
    "the stages from it to the last micro-batches' activations, one on a single stage; the same bits; an offloaded "
    "stage stays op-major)";

// --stage-gflops: each stage's GEMM rate, in GFLOP/s, comma-separated; the
// links all `link_gbps` GB/s with `link_us` of latency.
Result<std::vector<StageCost>> stage_costs_of(const std::string& rates, int stages, double link_gbps, double link_us) {
  std::vector<StageCost> out;
  std::stringstream in(rates);
  std::string item;
  while (std::getline(in, item, ',')) {
    char* end = nullptr;
    const double gflops = std::strtod(item.c_str(), &end);
    if (item.empty() || *end != '\0' || !(gflops > 0)) {
      return Status(ErrorCode::invalid_argument, "--stage-gflops: '" + item + "' is not a rate above 0 (GFLOP/s)");
    }
    out.push_back({.device = "stage " + std::to_string(out.size()),
                   .flops_per_second = gflops * 1e9,
                   .link_bytes_per_second = link_gbps * 1e9,
                   .link_latency_seconds = link_us * 1e-6});
  }
  if (static_cast<int>(out.size()) != stages) {
    return Status(ErrorCode::invalid_argument, "--stage-gflops gives " + std::to_string(out.size()) +
                                                   " rate(s) for " + std::to_string(stages) + " stage(s)");
  }
  if (!(link_gbps > 0) || !(link_us >= 0)) {
    return Status(ErrorCode::invalid_argument, "--link-gbps must be above 0 and --link-us at least 0");
  }
  out.back().link_bytes_per_second = 0;  // the last stage's is the one before it (partitioner.hpp)
  out.back().link_latency_seconds = 0;
  return out;
}

int plan(const std::string& model, int stages, int micro_batches, bool split, bool vram, int64_t budget,
         PipelineSchedule schedule, int checkpoint, const std::string& rates, double link_gbps, double link_us) {
  if (checkpoint > 1 && stages > 1) {
    return fail(Status(ErrorCode::invalid_argument, "--checkpoint with --stages " + std::to_string(stages) +
                                                        ": activation checkpointing runs on one stage for now"));
  }
  // As the trainer plans (job_plan.cpp): activations that do not fit the
  // budget even offloaded, on one stage, are checkpointed over the fewest
  // of 2, 4, 8, ... segments that fit.
  if (checkpoint == 0 && stages == 1 && budget > 0) {
    auto fits = [&](int segments) {
      auto graph = training_graph(model, micro_batches, 1, split, segments);
      if (!graph.ok()) return false;
      auto one = partition(*graph, 1, PartitionMethod::metis, micro_batches);
      return one.ok() && plan_memory(*graph, *one, 0, micro_batches, {.vram = vram, .budget = budget}).ok();
    };
    if (!fits(0)) {
      auto forward = load_model(model);
      const int forward_ops = forward.ok() ? static_cast<int>(forward->ops_of(Phase::forward).size()) : 0;
      for (int segments = 2; segments <= forward_ops; segments *= 2) {
        if (fits(segments)) {
          std::printf("activations do not fit the budget: checkpointed over %d segments (--checkpoint %d)\n\n",
                      segments, segments);
          checkpoint = segments;
          break;
        }
      }
    }
  }
  auto g = training_graph(model, micro_batches, stages, split, checkpoint);
  if (!g.ok()) return fail(g.status());
  auto p = partition(*g, stages, PartitionMethod::metis, micro_batches);
  if (!p.ok()) return fail(p.status());
  if (!rates.empty()) {
    auto costs = stage_costs_of(rates, stages, link_gbps, link_us);
    if (!costs.ok()) return fail(costs.status());
    JobPlan job;
    job.graph = *g;
    job.micro_batches = micro_batches;
    job.costs = *costs;
    job.flops_predicted_seconds = predict_stage_seconds(*g, *p, micro_batches, *costs);
    auto by_time = partition_by_time(*g, micro_batches, *costs);
    if (!by_time.ok()) return fail(by_time.status());
    p = by_time;
    job.partition = *p;
    std::printf("%s\n", describe_stages(job).c_str());
  }
  std::printf("model %s: %zu tensors, %zu ops (%zu forward, %zu backward, %zu update), %" PRId64 " parameters\n",
              g->name.c_str(), g->tensors.size(), g->ops.size(), g->ops_of(Phase::forward).size(),
              g->ops_of(Phase::backward).size(), g->ops_of(Phase::update).size(), g->param_elements());
  std::printf("%d stage(s) by %s: cut %s per micro-batch, imbalance flops %.1f%%, memory %.1f%%\n\n", stages,
              p->method == PartitionMethod::time ? "time" : "METIS",
              format_size(static_cast<uint64_t>(p->cut_bytes)).c_str(), 100 * p->flops_imbalance,
              100 * p->memory_imbalance);
  if (schedule == PipelineSchedule::one_f_one_b) {
    auto reordered = order_for_1f1b(*g, micro_batches, &*p);
    if (!reordered.ok()) return fail(reordered.status());
    if (!reordered->empty()) std::printf("%s\n\n", reordered->c_str());
  }
  int64_t total = 0;
  for (int s = 0; s < stages; ++s) {
    auto planned = plan_memory(*g, *p, s, micro_batches, {.vram = vram, .budget = budget, .schedule = schedule});
    if (!planned.ok()) return fail(planned.status());
    const MemoryPlan& mp = *planned;
    std::printf("%s", format_plan(*g, mp).c_str());
    std::printf("  total %s\n\n", format_size(static_cast<uint64_t>(mp.total_bytes())).c_str());
    total += mp.total_bytes();
  }
  std::printf("all stages: %s\n", format_size(static_cast<uint64_t>(total)).c_str());
  return 0;
}

int compare_partitions(const std::string& model, int parts, int micro_batches, bool show, bool split) {
  auto g = training_graph(model, micro_batches, parts, split);
  if (!g.ok()) return fail(g.status());
  std::printf("%-8s %14s %10s %10s\n", "METHOD", "CUT/MB", "FLOPS-IMB", "MEM-IMB");
  for (PartitionMethod m : {PartitionMethod::metis, PartitionMethod::greedy, PartitionMethod::random}) {
    auto p = partition(*g, parts, m, micro_batches);
    if (!p.ok()) return fail(p.status());
    std::printf("%-8s %14s %9.1f%% %9.1f%%\n", std::string(method_name(m)).c_str(),
                format_size(static_cast<uint64_t>(p->cut_bytes)).c_str(), 100 * p->flops_imbalance,
                100 * p->memory_imbalance);
    if (show) {
      const std::vector<int> forward = g->ops_of(Phase::forward);
      std::printf("   ");
      for (size_t v = 0; v < forward.size(); ++v) std::printf(" %s:%d", g->ops[forward[v]].name.c_str(), p->of_forward_op[v]);
      std::printf("\n");
    }
  }
  const double floor = flops_imbalance_floor(*g, parts, micro_batches);
  if (floor > 0.05) {
    std::printf("note: one op holds %.0f%% of the FLOPs, so no split into %d stages at op granularity balances "
                "FLOPs better than %.1f%%%s\n",
                100 * (floor + 1) / parts, parts, 100 * floor, split ? "" : " (without --no-split its matmul is split into column blocks)");
  }
  return 0;
}

// The environment `envp` lacks for this process's threads, as NAME=value.
// Element-wise kernels run on OpenMP threads and GEMMs on OpenBLAS's own.
// With libgomp's default (active) waiting its idle threads spin for a while
// after each parallel region and take the cores OpenBLAS needs next: a step
// of the Fashion-MNIST MLP takes 2-3x as long. libgomp reads the policy when
// it loads, so the process sets it and starts again (once). (Setting it
// before libgomp's constructor without starting again is not enough: libgomp
// then shows the policy passive but keeps spinning, GOMP_SPINCOUNT 300000,
// and the step took 12 ms instead of 2.4.) Ranks sharing a host share its
// cores: each takes its part for both pools (every rank with all of them ran
// twice the threads there are cores: two tensor-parallel ranks on two cores
// took 1.8x one rank's step, 0.78x with a thread each), unless the
// environment says how many. The ranks on this host, as the launcher says:
// TIERMEM_LOCAL_WORLD_SIZE, torchrun's LOCAL_WORLD_SIZE or Open MPI's
// OMPI_COMM_WORLD_LOCAL_SIZE.
std::vector<std::string> missing_thread_environment(char** envp) {
  const auto get = [envp](std::string_view name) -> const char* {
    for (char** e = envp; e != nullptr && *e != nullptr; ++e) {
      const std::string_view v(*e);
      if (v.size() > name.size() && v.starts_with(name) && v[name.size()] == '=') return *e + name.size() + 1;
    }
    return nullptr;
  };
  std::vector<std::string> out;
  if (get("OMP_WAIT_POLICY") == nullptr) out.emplace_back("OMP_WAIT_POLICY=passive");
  int local = 1;
  for (const char* name : {"TIERMEM_LOCAL_WORLD_SIZE", "LOCAL_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_SIZE"}) {
    if (const char* v = get(name); v != nullptr && std::atoi(v) > 0) {
      local = std::atoi(v);
      break;
    }
  }
  if (local > 1) {
    const std::string threads =
        std::to_string(std::max(1u, std::thread::hardware_concurrency() / static_cast<unsigned>(local)));
    for (const char* pool : {"OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS"}) {
      if (get(pool) == nullptr) out.push_back(std::string(pool) + "=" + threads);
    }
  }
  return out;
}

// The start again, from the executable's preinit array: it runs before any
// shared library's constructor (UCX's, OpenBLAS's thread pool, libgomp's,
// protobuf's), so the first process costs only the loading of the libraries.
// `tiermem-exec --version` took 49 ms starting again from main(), 40 ms from
// here, 24 ms with the environment set by the launcher: every rank's start,
// and a replacement rank's recovery, pays it. libc has not set `environ` yet
// there (getenv sees nothing, setenv starts an empty one): the environment is
// `envp`, and the new one is passed whole. Once: the new process has what
// was missing. Should the exec fail (no /proc), the process carries on as it
// is, its threads spinning.
void start_again_early(int, char** argv, char** envp) {
  std::vector<std::string> added = missing_thread_environment(envp);
  if (added.empty()) return;
  std::vector<char*> env;
  for (char** e = envp; e != nullptr && *e != nullptr; ++e) env.push_back(*e);
  for (std::string& a : added) env.push_back(a.data());
  env.push_back(nullptr);
  ::execve("/proc/self/exe", argv, env.data());
}
__attribute__((section(".preinit_array"), used)) void (*const k_start_again_early)(int, char**, char**) =
    &start_again_early;

}  // namespace

int main(int argc, char** argv) {
  // The thread environment is set: start_again_early, before any library loaded.
  keep_freed_memory_for_reuse();  // the snapshot's writes through the daemon (--replicas)
  // Progress lines as they happen, also into a pipe (ranks of a demo, logs).
  std::setvbuf(stdout, nullptr, _IOLBF, 0);
  CLI::App app{"tiermem-exec: train a partitioned graph on tiermem memory"};
  app.require_subcommand(1);
  app.set_version_flag("--version", std::string("tiermem-exec ") + TIERMEM_VERSION);
  int rc = 0;

  TrainOptions opt;
  int64_t timeout_s = 120;
  auto* train_cmd = app.add_subcommand("train", "train MODEL as one rank (rank and world size from the environment)");
  train_cmd->add_option("MODEL", opt.model, "model file (config/models/*.pbtxt)")->required()->check(CLI::ExistingFile);
  train_cmd->add_option("--job", opt.job, "job name: ranks of a job share it; a restarted rank resumes it")->capture_default_str();
  train_cmd->add_option("-s,--socket", opt.socket, "local tiermemd socket (default $TIERMEM_SOCKET)");
  train_cmd->add_option("--device", opt.device,
                        "where the kernels run: cpu, cuda (device 0) or cuda:N; on a GPU the tensors live in the "
                        "daemon's VRAM tier")
      ->capture_default_str();
  train_cmd->add_option("--precision", opt.precision,
                        "what the GEMMs compute in: fp32, or bf16 (a GPU: operands rounded to bf16, products summed "
                        "in fp32; parameters, optimizer state and activations stay fp32)")
      ->capture_default_str()
      ->check(CLI::IsMember({"fp32", "bf16"}));
  std::string budget_text;
  train_cmd->add_option("--vram-budget,--budget", budget_text, k_budget_help);
  std::string offload_update = "device";
  train_cmd->add_option("--offload-update", offload_update,
                        "offloaded (--vram-budget), where the optimizer runs: device (its kernels, chunk by chunk "
                        "through the window: the bits of a run that fits), host (the CPU over the home tier, "
                        "ZeRO-Offload's way: no optimizer state crosses the bus) or auto (per parameter: the host "
                        "takes those whose gradients come home first, beside the backward pass, the device the rest, "
                        "cut where the step is shortest by the host's Adam rate, the link's rate and the backward "
                        "pass measured in the first step; it prints why)")
      ->capture_default_str()
      ->check(CLI::IsMember({"device", "host", "auto"}));
  train_cmd->add_option("--offload-host-share", opt.host_share,
                        "with --offload-update auto: this share of the parameters (0 to 1, by elements) on the host "
                        "instead of the measured choice")
      ->check(CLI::Range(0.0, 1.0));
  bool no_graphs = false;
  train_cmd->add_flag("--no-graphs", no_graphs,
                      "on a GPU, launch every kernel of every step instead of replaying the step captured once as a "
                      "CUDA graph");
  train_cmd->add_option("--stages", opt.stages,
                         "pipeline stages (default: one per rank, or per tensor-parallel group; the rest are "
                         "data-parallel replicas)");
  train_cmd->add_option("--tensor-parallel", opt.tensor_parallel,
                        "ranks that split each attention (by heads) and MLP (by columns) between them, Megatron-style, "
                        "summing their partial results (NCCL between GPU ranks, tiermem otherwise: --collectives)")
      ->capture_default_str()
      ->check(CLI::Range(1, 64));
  train_cmd->add_option("--micro-batches", opt.micro_batches, "micro-batches per step")->capture_default_str();
  train_cmd->add_option("--schedule", opt.schedule, k_schedule_help)
      ->capture_default_str()
      ->check(CLI::IsMember({"gpipe", "1f1b"}));
  train_cmd->add_option("--checkpoint", opt.checkpoint, k_checkpoint_help)->check(CLI::NonNegativeNumber);
  train_cmd->add_option("--collectives", opt.collectives,
                        "how data-parallel replicas all-reduce their gradients and tensor-parallel ranks sum their "
                        "parts: auto (NCCL in a group whose ranks are all on GPUs, the gradients in buckets beside "
                        "the backward pass; tiermem otherwise), nccl (an error where a member cannot), tiermem")
      ->capture_default_str()
      ->check(CLI::IsMember({"auto", "nccl", "tiermem"}));
  double bucket_mib = 25;
  train_cmd->add_option("--bucket-mib", bucket_mib,
                        "with NCCL: MiB of gradients per all-reduce bucket (whole gradients; a larger one is a "
                        "bucket of its own)")
      ->capture_default_str()
      ->check(CLI::Range(0.001, 4096.0));
  train_cmd->add_option("--balance", opt.balance,
                        "how the pipeline's stages are cut: flops (METIS, FLOPs and memory even), time (each rank "
                        "measures its device's GEMM rate and its link at start; the stages take equal predicted "
                        "time), auto (time when the ranks' devices differ)")
      ->capture_default_str()
      ->check(CLI::IsMember({"auto", "flops", "time"}));
  train_cmd->add_option("--slowdown", opt.slowdown,
                        "emulate a device this many times slower (CPU ranks): every kernel takes that much longer, "
                        "the rest asleep; for experiments with mixed meshes")
      ->capture_default_str()
      ->check(CLI::Range(1.0, 1000.0));
  train_cmd->add_option("--slowdown-from", opt.slowdown_from,
                        "with --slowdown: the step the slowdown starts at (0: from the start, the device's "
                        "calibration too); a rank that turns slow mid-run, for --replan")
      ->capture_default_str();
  train_cmd->add_flag("--replan", opt.replan.enabled,
                      "cut the pipeline again while it trains when it stays slow and a cut by the stages' measured "
                      "speeds is predicted faster; the parameters and optimizer state of the ops that change "
                      "stages move through tiermem at a step boundary");
  train_cmd->add_option("--replan-every-ms", opt.replan.every_ms, "with --replan: milliseconds between looks")
      ->capture_default_str()
      ->check(CLI::Range(1, 3600000));
  train_cmd->add_option("--replan-p99-ms", opt.replan.p99_ms,
                        "with --replan: the step time's P99 (of the last 64) it must stay over")
      ->capture_default_str()
      ->check(CLI::Range(0.0, 3600000.0));
  train_cmd->add_option("--replan-cpu-percent", opt.replan.cpu_percent,
                        "with --replan: the busiest node's CPU use it must stay over (0: any)")
      ->capture_default_str()
      ->check(CLI::Range(0.0, 100.0));
  train_cmd->add_option("--replan-min-gain", opt.replan.min_gain,
                        "with --replan: how much faster the new cut's slowest stage must be predicted (0.2: 20 %)")
      ->capture_default_str()
      ->check(CLI::Range(0.0, 0.99));
  train_cmd->add_option("--replan-patience", opt.replan.patience,
                        "with --replan: looks in a row the thresholds must hold")
      ->capture_default_str()
      ->check(CLI::Range(1, 1000));
  train_cmd->add_option("--epochs", opt.epochs, "epochs to train")->capture_default_str();
  train_cmd->add_option("--steps", opt.steps, "stop after this many steps (instead of --epochs)");
  train_cmd->add_option("--seed", opt.seed, "seed of initialisation, data split and shuffling")->capture_default_str();
  bool no_shuffle = false;
  train_cmd->add_flag("--no-shuffle", no_shuffle, "take the training rows in order");
  train_cmd->add_option("--data", opt.data, "dataset file or directory (default: the Debian package's)");
  train_cmd->add_option("--trace", opt.trace, "write a Chrome/Perfetto trace (.rankN appended when world > 1); on a GPU with --no-graphs each op "
                        "waits for its kernels, so that its span is their time (tools/trace-top.py sums them up)");
  train_cmd->add_option("--losses", opt.losses, "write every step's loss (hex float per line)");
  train_cmd->add_option("--dump", opt.dump, "write the initial parameters (and --dump-batches batches) here");
  train_cmd->add_option("--dump-batches", opt.dump_batches, "batches to write with --dump");
  train_cmd->add_option("--snapshot-every", opt.snapshot_every,
                        "copy the committed parameters and optimizer state to PMEM every N steps");
  train_cmd->add_option("--replicas", opt.replicas,
                        "keep that copy, of every step, also on N other nodes: a rank whose node died resumes "
                        "on another one at the last committed step (data-parallel jobs)");
  bool train_no_split = false;
  train_cmd->add_flag("--no-split", train_no_split,
                      "keep every op whole (by default a matmul too heavy to balance the stages is split into column blocks)");
  train_cmd->add_option("--log-every", opt.log_every, "steps between progress lines (default: every epoch)");
  train_cmd->add_option("--timeout", timeout_s, "seconds to wait for another rank before giving up")->capture_default_str();
  train_cmd->add_flag("-q,--quiet", opt.quiet, "no progress lines");
  train_cmd->add_flag("--keep", opt.keep,
                      "leave the job's memory in tiermem when it ends (by default every rank frees its own once all "
                      "ranks are done)");
  train_cmd->add_flag("--restart", opt.restart,
                      "free this rank's memory of an earlier run of the job first and train from step 0 (a finished "
                      "job kept with --keep is refused otherwise)");
  train_cmd->callback([&] {
    opt.shuffle = !no_shuffle;
    opt.bucket_bytes = std::max<int64_t>(4, static_cast<int64_t>(bucket_mib * (1 << 20)));
    opt.graphs = !no_graphs;
    opt.split = !train_no_split;
    opt.timeout = std::chrono::seconds(timeout_s);
    auto budget = budget_of(budget_text);
    if (!budget.ok()) {
      rc = fail(budget.status());
      return;
    }
    opt.budget = *budget;
    opt.offload_update = offload_update == "host"   ? TrainOptions::OffloadUpdate::host
                         : offload_update == "auto" ? TrainOptions::OffloadUpdate::automatic
                                                    : TrainOptions::OffloadUpdate::device;
    if (opt.host_share >= 0 && opt.offload_update != TrainOptions::OffloadUpdate::automatic) {
      rc = fail(Status(ErrorCode::invalid_argument,
                       "--offload-host-share splits the optimizer between host and device: it needs "
                       "--offload-update auto (this run has --offload-update " + offload_update + ")"));
      return;
    }
    auto env = rank_from_environment();
    if (!env.ok()) {
      rc = fail(env.status());
      return;
    }
    opt.hooks = read_runtime_hooks();  // the test hooks, once
    rc = train(opt, *env);
  });

  std::string model;
  int stages = 1, micro_batches = 2, parts = 2;
  auto* plan_cmd = app.add_subcommand("plan", "print the static memory plan of every stage");
  plan_cmd->add_option("MODEL", model, "model file")->required()->check(CLI::ExistingFile);
  plan_cmd->add_option("--stages", stages, "pipeline stages")->capture_default_str();
  plan_cmd->add_option("--micro-batches", micro_batches, "micro-batches per step")->capture_default_str();
  std::string plan_schedule = "gpipe";
  plan_cmd->add_option("--schedule", plan_schedule, k_schedule_help)
      ->capture_default_str()
      ->check(CLI::IsMember({"gpipe", "1f1b"}));
  int plan_checkpoint = 0;
  plan_cmd->add_option("--checkpoint", plan_checkpoint, k_checkpoint_help)->check(CLI::NonNegativeNumber);
  bool no_split = false;
  plan_cmd->add_flag("--no-split", no_split, "keep every op whole (see `partition`)");
  std::string plan_device = "cpu";
  plan_cmd->add_option("--device", plan_device, "where the kernels would run (cuda: the tensors in VRAM)")
      ->capture_default_str();
  std::string plan_budget;
  plan_cmd->add_option("--vram-budget,--budget", plan_budget, k_budget_help);
  std::string stage_gflops;
  double link_gbps = 10, link_us = 10;
  plan_cmd->add_option("--stage-gflops", stage_gflops,
                       "each stage's GEMM rate in GFLOP/s, comma-separated (e.g. 50000,40,40,40 for a GPU and three "
                       "CPU stages, as a job's ranks print them): cut the stages by predicted time, not FLOPs");
  plan_cmd->add_option("--link-gbps", link_gbps, "with --stage-gflops: GB/s between neighbouring stages")
      ->capture_default_str();
  plan_cmd->add_option("--link-us", link_us, "with --stage-gflops: microseconds of latency between them")
      ->capture_default_str();
  plan_cmd->callback([&] {
    auto budget = budget_of(plan_budget);
    const PipelineSchedule schedule = plan_schedule == "1f1b" ? PipelineSchedule::one_f_one_b : PipelineSchedule::gpipe;
    rc = budget.ok() ? plan(model, stages, micro_batches, !no_split, plan_device != "cpu", *budget, schedule,
                            plan_checkpoint, stage_gflops, link_gbps, link_us)
                     : fail(budget.status());
  });

  SampleOptions sample_opt;
  auto* sample_cmd = app.add_subcommand("sample", "print text drawn from a model of bytes (a GPT) trained with --keep");
  sample_cmd->add_option("MODEL", sample_opt.model, "the model file it was trained from")->required()->check(CLI::ExistingFile);
  sample_cmd->add_option("--job", sample_opt.job, "the kept job (trained with --keep, one stage)")->required();
  sample_cmd->add_option("-s,--socket", sample_opt.socket, "local tiermemd socket (default $TIERMEM_SOCKET)");
  sample_cmd->add_option("--prompt", sample_opt.prompt, "text to start from");
  sample_cmd->add_option("--bytes", sample_opt.bytes, "bytes to draw")->capture_default_str()->check(CLI::Range(1, 1 << 20));
  sample_cmd->add_option("--temperature", sample_opt.temperature, "softmax temperature (0: the most likely byte)")
      ->capture_default_str()
      ->check(CLI::Range(0.0, 10.0));
  sample_cmd->add_option("--seed", sample_opt.seed, "seed of the draws")->capture_default_str();
  sample_cmd->callback([&] { rc = sample(sample_opt); });

  auto* part_cmd = app.add_subcommand("partition", "compare METIS, greedy and random partitions");
  part_cmd->add_option("MODEL", model, "model file")->required()->check(CLI::ExistingFile);
  part_cmd->add_option("--parts", parts, "parts")->capture_default_str();
  part_cmd->add_option("--micro-batches", micro_batches, "micro-batches per step")->capture_default_str();
  bool show = false;
  part_cmd->add_flag("--show", show, "print the stage of every forward op");
  part_cmd->add_flag("--no-split", no_split,
                     "keep every op whole (by default a matmul too heavy to balance is split into column blocks)");
  part_cmd->callback([&] { rc = compare_partitions(model, parts, micro_batches, show, !no_split); });

  add_man_flag(app, {.name = "tiermem-exec",
                     .section = 1,
                     .summary = "train a partitioned graph on tiermem memory, one rank per process",
                     .source = std::string("tiermem ") + TIERMEM_VERSION,
                     .see_also = {"tiermemd(8)", "tiermemctl(8)"},
                     .extra = ".SH ENVIRONMENT\n.TP\nTIERMEM_RANK, TIERMEM_WORLD_SIZE, TIERMEM_LOCAL_WORLD_SIZE\n"
                              "this rank and the job's size (also RANK, WORLD_SIZE, LOCAL_WORLD_SIZE as torchrun "
                              "sets them, and Slurm's and Open MPI's)\n.TP\nTIERMEM_SOCKET\nthe local daemon's "
                              "socket when --socket is not given\n"});
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    const int code = app.exit(e);
    return code == 0 ? 0 : 2;
  }
  return rc;
}
