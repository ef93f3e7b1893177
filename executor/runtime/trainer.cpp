// Trainer: set-up (model, plan, memory in tiermem, peers, checks) and the
// step loop with progress and summary. The step itself is in trainer_step.cpp.
#include <algorithm>
#include <atomic>
#include <cinttypes>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>

#include <tiermem/status_macros.h>
#include <tiermem/units.h>

#include "executor/interpreter.hpp"
#include "executor/runtime/trainer_impl.hpp"
#include "executor/split.hpp"

namespace tiermem::exec {
namespace {

constexpr int64_t k_info_bytes = 64 << 10;
constexpr int64_t k_info_mesh = 32 << 10;  // 256 floats of the mesh check
constexpr int64_t k_info_hash = 33 << 10;  // its hash
constexpr int k_mesh_floats = 256;         // 1 KiB
constexpr int k_latency_rounds = 50;

int64_t align64(int64_t n) { return (n + 63) / 64 * 64; }

uint64_t fnv(const void* data, size_t n) {
  uint64_t h = 1469598103934665603ull;
  for (size_t i = 0; i < n; ++i) {
    h ^= static_cast<const unsigned char*>(data)[i];
    h *= 1099511628211ull;
  }
  return h;
}

}  // namespace

Status Trainer::load() {
  TIERMEM_ASSIGN_OR_RETURN(auto g, load_model(m_opt.model));
  m_graph = std::move(g);
  m_topo.stages = m_opt.stages > 0 ? m_opt.stages : m_env.world;
  if (m_env.world % m_topo.stages != 0) {
    return Status(ErrorCode::invalid_argument, "a world of " + std::to_string(m_env.world) +
                                                   " ranks cannot be split into " + std::to_string(m_topo.stages) +
                                                   " pipeline stages");
  }
  m_topo.replicas = m_env.world / m_topo.stages;
  m_topo.rank = m_env.rank;
  if (m_opt.micro_batches < 1) return Status(ErrorCode::invalid_argument, "--micro-batches must be at least 1");
  if (m_opt.split) {
    // Every rank rewrites the same graph the same way: the split is a pure
    // function of the model, the stages and the micro-batches.
    TIERMEM_ASSIGN_OR_RETURN(auto report, split_for_balance(m_graph, m_topo.stages, m_opt.micro_batches));
    m_split_report = std::move(report);
  }
  Status s = add_training(m_graph, 1.0f / static_cast<float>(m_opt.micro_batches * m_topo.replicas));
  if (!s.ok()) return s;
  TIERMEM_ASSIGN_OR_RETURN(auto p, partition(m_graph, m_topo.stages, PartitionMethod::metis, m_opt.micro_batches));
  m_partition = std::move(p);
  m_channels = channels_of(m_graph, m_partition);
  m_plan = plan_memory(m_graph, m_partition, m_topo.stage(), m_opt.micro_batches);
  m_loss_stage = m_partition.of_op[m_graph.tensors[m_graph.loss].producer];

  // Data: every rank runs the same schedule of batches, so every rank knows
  // how many steps an epoch has; only stages that read inputs or labels load
  // the rows themselves.
  TIERMEM_ASSIGN_OR_RETURN(auto data, load_dataset(m_graph.dataset, m_opt.data, m_opt.seed));
  m_data = std::move(data);
  for (int t = 0; t < static_cast<int>(m_graph.tensors.size()); ++t) {
    const Tensor& tensor = m_graph.tensors[t];
    if (tensor.role == Role::input && tensor.shape[1] != m_data.train.cols) {
      return Status(ErrorCode::invalid_argument, "input '" + tensor.name + "' has " + std::to_string(tensor.shape[1]) +
                                                     " features, dataset " + m_data.name + " has " +
                                                     std::to_string(m_data.train.cols));
    }
  }
  for (const auto& [op, mb] : m_plan.schedule) {
    for (int t : m_graph.ops[op].in) {
      m_has_data = m_has_data || m_graph.tensors[t].role == Role::input || m_graph.tensors[t].role == Role::label;
    }
  }
  const int64_t global = m_graph.micro_batch * m_opt.micro_batches * m_topo.replicas;
  m_steps_per_epoch = std::max<int64_t>(1, m_data.train.rows / global);
  m_total_steps = m_opt.steps > 0 ? m_opt.steps : m_opt.epochs * m_steps_per_epoch;
  m_eval_batches = (m_data.test.rows + m_graph.micro_batch - 1) / m_graph.micro_batch;
  m_test_order.resize(static_cast<size_t>(m_data.test.rows));
  for (int64_t i = 0; i < m_data.test.rows; ++i) m_test_order[static_cast<size_t>(i)] = i;
  return Status();
}

Status Trainer::allocate() {
  TIERMEM_ASSIGN_OR_RETURN(auto client,
                           Client::connect({.socket_path = m_opt.socket, .client_name = "tiermem-exec rank " + std::to_string(m_env.rank)}));
  m_client = std::move(client);
  m_dir = std::make_unique<JobDirectory>(*m_client, m_opt.job, m_env.rank, m_opt.timeout);

  const int64_t ctl_bytes = ((k_channels + 4 * static_cast<int64_t>(m_channels.size())) * 8 + 4095) / 4096 * 4096;
  auto own = [&](OwnRegion* out, const std::string& what, int64_t bytes, bool coherent, Tier tier = Tier::dram) -> Status {
    TIERMEM_ASSIGN_OR_RETURN(auto r,
                             m_dir->own(what, static_cast<uint64_t>(std::max<int64_t>(bytes, 64)), {.tier = tier, .coherent = coherent}));
    *out = std::move(r);
    return Status();
  };
  for (const ArenaPlan& a : m_plan.arenas) {
    if (a.name == "params") m_params_bytes = a.bytes;
    if (a.name == "optimizer") m_optimizer_bytes = a.bytes;
  }
  int64_t mbox = 0;
  for (const Channel& c : m_channels) {
    if (c.to == m_topo.stage() && c.forward) mbox = std::max(mbox, mailbox_offset(c, true) + m_opt.micro_batches * (k_header_bytes + align64(c.bytes)));
    if (c.to == m_topo.stage()) mbox = std::max(mbox, mailbox_offset(c, false) + m_opt.micro_batches * (k_header_bytes + align64(c.bytes)));
  }
  int64_t grads_bytes = 0;
  for (const ArenaPlan& a : m_plan.arenas) {
    if (a.name == "grads") grads_bytes = a.bytes;
  }
  Status s;
  if (s = own(&m_ctl, "ctl", ctl_bytes, true); !s.ok()) return s;
  if (s = own(&m_info, "info", k_info_bytes, false); !s.ok()) return s;
  if (s = own(&m_mbox, "mbox", mbox, false); !s.ok()) return s;
  if (m_topo.replicas > 1) {
    if (s = own(&m_publish, "publish", 2 * grads_bytes, false); !s.ok()) return s;
  }
  if (s = own(&m_params, "params", 2 * m_params_bytes, false); !s.ok()) return s;
  if (s = own(&m_grads, "grads", grads_bytes, false); !s.ok()) return s;
  if (s = own(&m_optimizer, "optimizer", 2 * m_optimizer_bytes, false); !s.ok()) return s;
  if (s = own(&m_work, "work", m_plan.work_peak, false); !s.ok()) return s;
  if (m_opt.snapshot_every > 0) {
    s = own(&m_snapshot, "snapshot", k_snapshot_header + m_params_bytes + m_optimizer_bytes, false, Tier::pmem);
    if (!s.ok()) return s.with_context("the PMEM snapshot (--snapshot-every)");
  }
  m_resumed = m_ctl.existed && load_local(m_ctl.as<uint64_t>() + k_committed) > 0;
  m_eval_resume = m_resumed;
  return Status();
}

Status Trainer::initialise() {
  if (m_resumed) {
    if (!m_params.existed || !m_optimizer.existed) {
      return Status(ErrorCode::failed_precondition, "job " + m_opt.job + " has a committed step but its parameters are gone");
    }
    m_start_step = static_cast<int64_t>(load_local(m_ctl.as<uint64_t>() + k_committed));
    std::fprintf(stderr, "rank %d: resumed at step %" PRId64 " (committed in tiermem), parameters of that step\n",
                 m_env.rank, m_start_step);
  } else {
    for (const Placement& p : m_plan.params) {
      init_param(m_graph.tensors[p.tensor], reinterpret_cast<float*>(m_params.data() + p.offset), m_opt.seed);
    }
    std::memset(m_optimizer.data(), 0, static_cast<size_t>(2 * m_optimizer_bytes));
    if (!m_opt.dump.empty()) {
      std::filesystem::create_directories(m_opt.dump);
      for (const Placement& p : m_plan.params) {
        std::ofstream out(m_opt.dump + "/" + m_graph.tensors[p.tensor].name + ".f32", std::ios::binary);
        out.write(reinterpret_cast<const char*>(m_params.data() + p.offset), m_graph.tensors[p.tensor].bytes());
      }
    }
  }
  // What this rank sends and receives, for the others to compare (X6).
  const std::string text = boundary_text();
  const uint64_t length = text.size();
  std::memcpy(m_info.data(), &length, 8);
  std::memcpy(m_info.data() + 8, text.data(), std::min<size_t>(text.size(), k_info_mesh - 8));
  return Status();
}

std::string Trainer::boundary_text() const {
  std::string out;
  for (const Channel& c : m_channels) {
    if (c.from != m_topo.stage() && c.to != m_topo.stage()) continue;
    const Tensor& t = m_graph.tensors[c.tensor];
    out += t.name + " " + shape_text(t.shape) + " " + (t.dtype == DType::f32 ? "f32" : "i32") + "\n";
  }
  return out;
}

Status Trainer::find_peers() {
  for (int r = 0; r < m_env.world; ++r) {
    if (r == m_env.rank) {
      m_peer_ctl[r] = m_ctl.gva;
      continue;
    }
    if (!m_opt.quiet && !m_resumed) std::fprintf(stderr, "rank %d: waiting for rank %d\n", m_env.rank, r);
    TIERMEM_ASSIGN_OR_RETURN(auto g, m_dir->peer(r, "ctl"));
    m_peer_ctl[r] = g;
  }
  for (const Channel& c : m_channels) {
    if (c.from != m_topo.stage()) continue;
    TIERMEM_ASSIGN_OR_RETURN(auto g, m_dir->peer(m_topo.rank_of(c.to, m_topo.replica()), "mbox"));
    m_peer_mbox[c.id] = g;
  }
  return Status();
}

// Gradient topology (X6): every rank compares the boundary tensors it shares
// with the others' view of them.
Status Trainer::check_shapes() {
  std::map<std::string, std::string> mine;
  {
    std::istringstream in(boundary_text());
    std::string name, rest;
    while (in >> name && std::getline(in, rest)) mine[name] = rest;
  }
  for (int r = 0; r < m_env.world; ++r) {
    if (r == m_env.rank) continue;
    TIERMEM_ASSIGN_OR_RETURN(auto info, m_dir->peer(r, "info"));
    uint64_t length = 0;
    TIERMEM_RETURN_IF_ERROR(m_client->read(info, &length, 8));
    std::string text(std::min<uint64_t>(length, k_info_mesh - 8), '\0');
    TIERMEM_RETURN_IF_ERROR(m_client->read(info.plus(8), text.data(), text.size()));
    std::istringstream in(text);
    std::string name, rest;
    while (in >> name && std::getline(in, rest)) {
      auto it = mine.find(name);
      if (it != mine.end() && it->second != rest) {
        return Status(ErrorCode::failed_precondition,
                      "Gradient topology mismatch: boundary tensor '" + name + "' is" + it->second + " on rank " +
                          std::to_string(m_env.rank) + " (stage " + std::to_string(m_topo.stage()) + ") but" + rest +
                          " on rank " + std::to_string(r) + "; every rank must load the same model");
      }
    }
  }
  return Status();
}

// Mesh validation (X8): all-reduce a random 1 KiB tensor through the memory
// service and compare the result's hash on every rank; measure the round
// trip to rank 0.
Status Trainer::validate_mesh() {
  auto* mesh = reinterpret_cast<float*>(m_info.data() + k_info_mesh);
  std::mt19937 rng(static_cast<uint32_t>(m_opt.seed * 7919 + static_cast<uint64_t>(m_env.rank)));
  std::uniform_real_distribution<float> u(-1, 1);
  for (int i = 0; i < k_mesh_floats; ++i) mesh[i] = u(rng);
  auto* ctl = m_ctl.as<uint64_t>();
  std::atomic_ref<uint64_t>(ctl[k_mesh]).store(std::max<uint64_t>(load_local(ctl + k_mesh), 1));
  std::vector<float> sum(k_mesh_floats, 0.0f), theirs(k_mesh_floats);
  for (int r = 0; r < m_env.world; ++r) {
    if (Status s = m_dir->wait_at_least(m_peer_ctl[r].plus(8 * k_mesh), 1, "rank " + std::to_string(r) + " to join the mesh check");
        !s.ok()) {
      return s;
    }
    TIERMEM_ASSIGN_OR_RETURN(auto info, r == m_env.rank ? Result<Gva>(m_info.gva) : m_dir->peer(r, "info"));
    TIERMEM_RETURN_IF_ERROR(m_client->read(info.plus(k_info_mesh), theirs.data(), k_mesh_floats * 4));
    for (int i = 0; i < k_mesh_floats; ++i) sum[i] += theirs[i];
  }
  const uint64_t hash = fnv(sum.data(), sum.size() * 4);
  std::memcpy(m_info.data() + k_info_hash, &hash, 8);
  std::atomic_ref<uint64_t>(ctl[k_mesh]).store(2);
  for (int r = 0; r < m_env.world; ++r) {
    if (Status s = m_dir->wait_at_least(m_peer_ctl[r].plus(8 * k_mesh), 2, "rank " + std::to_string(r) + "'s mesh hash");
        !s.ok()) {
      return s;
    }
    auto info = r == m_env.rank ? Result<Gva>(m_info.gva) : m_dir->peer(r, "info");
    uint64_t theirs_hash = 0;
    TIERMEM_RETURN_IF_ERROR(m_client->read(info->plus(k_info_hash), &theirs_hash, 8));
    if (theirs_hash != hash) {
      return Status(ErrorCode::internal, "mesh validation failed: the all-reduced 1 KiB tensor hashes to " +
                                             std::to_string(hash) + " on rank " + std::to_string(m_env.rank) + " but " +
                                             std::to_string(theirs_hash) + " on rank " + std::to_string(r));
    }
  }
  // Latency: rank 0 rings every other rank k_latency_rounds times.
  std::vector<double> rtt;
  if (!m_resumed && m_env.world > 1) {
    if (m_env.rank == 0) {
      for (int r = 1; r < m_env.world; ++r) {
        for (uint64_t i = 1; i <= k_latency_rounds; ++i) {
          const auto t0 = std::chrono::steady_clock::now();
          TIERMEM_RETURN_IF_ERROR(m_dir->raise(m_peer_ctl[r].plus(8 * k_ping), i));
          if (Status s = wait_local(ctl + k_pong + r, i, m_opt.timeout, "rank " + std::to_string(r) + "'s pong"); !s.ok()) {
            return s;
          }
          rtt.push_back(std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count());
        }
      }
    } else {
      for (uint64_t i = 1; i <= k_latency_rounds; ++i) {
        TIERMEM_RETURN_IF_ERROR(wait_local(ctl + k_ping, i, m_opt.timeout, "rank 0's ping"));
        TIERMEM_RETURN_IF_ERROR(m_dir->raise(m_peer_ctl[0].plus(8 * (k_pong + m_env.rank)), i));
      }
    }
  }
  if (m_env.rank == 0 && !m_opt.quiet) {
    std::sort(rtt.begin(), rtt.end());
    std::printf("mesh validation: 1 KiB all-reduce over %d rank(s) agrees (hash %016" PRIx64 ")", m_env.world, hash);
    if (!rtt.empty()) std::printf("; send/receive round trip p50 %.1f us, max %.1f us", rtt[rtt.size() / 2], rtt.back());
    std::printf("\n");
  }
  return Status();
}

Status Trainer::run() {
  Status s = load();
  if (s.ok()) s = allocate();
  if (s.ok()) s = initialise();
  if (s.ok()) s = find_peers();
  if (s.ok()) s = check_shapes();
  if (s.ok()) s = validate_mesh();
  if (!s.ok()) return s;
  const bool reporter = m_topo.stage() == m_loss_stage && m_topo.replica() == 0;
  if (reporter && !m_opt.quiet) {
    std::printf("training %s on %s: %" PRId64 " train / %" PRId64 " test rows, %d stage(s) x %d replica(s), "
                "%d micro-batch(es) of %" PRId64 ", %" PRId64 " steps (%" PRId64 " per epoch)\n",
                m_graph.name.c_str(), m_data.name.c_str(), m_data.train.rows, m_data.test.rows, m_topo.stages,
                m_topo.replicas, m_opt.micro_batches, m_graph.micro_batch, m_total_steps, m_steps_per_epoch);
    std::printf("stage %d: %s in tiermem (%s work arena, %.1fx reuse); partition cut %s per micro-batch, "
                "imbalance flops %.1f%% memory %.1f%%\n",
                m_topo.stage(), format_size(static_cast<uint64_t>(m_plan.total_bytes())).c_str(),
                format_size(static_cast<uint64_t>(m_plan.work_peak)).c_str(),
                m_plan.work_peak > 0 ? static_cast<double>(m_plan.work_naive) / static_cast<double>(m_plan.work_peak) : 1.0,
                format_size(static_cast<uint64_t>(m_partition.cut_bytes)).c_str(),
                100 * m_partition.flops_imbalance, 100 * m_partition.memory_imbalance);
    for (const std::string& line : m_split_report) std::printf("%s\n", line.c_str());
    std::fflush(stdout);
  }
  std::FILE* losses = nullptr;
  if (!m_opt.losses.empty() && reporter) losses = std::fopen(m_opt.losses.c_str(), m_resumed ? "a" : "w");

  const auto started = std::chrono::steady_clock::now();
  auto window_start = started;
  int64_t window_steps = 0;
  double window_loss = 0, window_comm = 0, window_compute = 0;
  int64_t window_correct = 0, window_rows = 0;
  double last_accuracy = -1;
  if (m_resumed && m_start_step % m_steps_per_epoch == 0 && m_topo.replica() == 0) {
    // The evaluation due after the committed step may have been cut short.
    m_step = m_start_step - 1;
    TIERMEM_RETURN_IF_ERROR(evaluate(m_start_step / m_steps_per_epoch - 1, &last_accuracy));
  }
  std::vector<double> step_seconds;  // for the median in the summary
  step_seconds.reserve(static_cast<size_t>(std::max<int64_t>(0, m_total_steps - m_start_step)));
  for (int64_t step = m_start_step; step < m_total_steps; ++step) {
    const auto step_start = std::chrono::steady_clock::now();
    if (Status st = run_step(step); !st.ok()) return st.with_context("step " + std::to_string(step));
    step_seconds.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - step_start).count());
    if (losses != nullptr) {
      std::fprintf(losses, "%a\n", m_loss_sum / m_opt.micro_batches);
      std::fflush(losses);
    }
    ++window_steps;
    window_loss += m_loss_sum / m_opt.micro_batches;
    window_correct += m_correct;
    window_rows += m_rows;
    const bool epoch_end = (step + 1) % m_steps_per_epoch == 0;
    const bool last = step + 1 == m_total_steps;
    if (epoch_end && m_topo.replica() == 0) {
      TIERMEM_RETURN_IF_ERROR(evaluate((step + 1) / m_steps_per_epoch - 1, &last_accuracy));
    }
    const bool log = m_opt.log_every > 0 ? (step + 1) % m_opt.log_every == 0 || last : epoch_end || last;
    if (log && reporter && !m_opt.quiet) {
      const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - window_start).count();
      const double step_ms = 1e3 * secs / static_cast<double>(window_steps);
      const double comm = m_trace.seconds(SpanKind::comm) + m_trace.seconds(SpanKind::sync);
      const double compute = m_trace.seconds(SpanKind::compute);
      std::printf("epoch %" PRId64 "/%" PRId64 "  step %" PRId64 "  loss %.4f  train acc %.1f%%  ",
                  step / m_steps_per_epoch + 1, (m_total_steps + m_steps_per_epoch - 1) / m_steps_per_epoch, step + 1,
                  window_loss / static_cast<double>(window_steps),
                  100.0 * static_cast<double>(window_correct) / static_cast<double>(std::max<int64_t>(1, window_rows)));
      if (last_accuracy >= 0 && epoch_end) std::printf("test acc %.1f%%  ", 100 * last_accuracy);
      std::printf("%.0f samples/s  step %.2f ms (communication %.0f%%)\n",
                  static_cast<double>(window_steps * m_graph.micro_batch * m_opt.micro_batches * m_topo.replicas) / secs,
                  step_ms, 100 * (comm - window_comm) / std::max(1e-9, comm - window_comm + compute - window_compute));
      std::fflush(stdout);
      window_start = std::chrono::steady_clock::now();
      window_steps = window_correct = window_rows = 0;
      window_loss = 0;
      window_comm = comm;
      window_compute = compute;
    }
  }
  if (losses != nullptr) std::fclose(losses);
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
  const int64_t steps = m_total_steps - m_start_step;
  const double comm = m_trace.seconds(SpanKind::comm) + m_trace.seconds(SpanKind::sync);
  const double busy = comm + m_trace.seconds(SpanKind::compute);
  if (reporter && !m_opt.quiet) {
    double median = 0;
    if (!step_seconds.empty()) {
      auto mid = step_seconds.begin() + static_cast<std::ptrdiff_t>(step_seconds.size() / 2);
      std::nth_element(step_seconds.begin(), mid, step_seconds.end());
      median = *mid;
    }
    std::printf("summary: %" PRId64 " steps in %.2f s, %.2f ms per step (median %.2f ms), communication %.0f%% of step time",
                steps, secs, steps > 0 ? 1e3 * secs / static_cast<double>(steps) : 0.0, 1e3 * median,
                busy > 0 ? 100 * comm / busy : 0.0);
    if (last_accuracy >= 0) std::printf(", test accuracy %.2f%%", 100 * last_accuracy);
    std::printf("\n");
  }
  if (!m_opt.trace.empty()) {
    const std::string path = m_env.world > 1 ? m_opt.trace + ".rank" + std::to_string(m_env.rank) : m_opt.trace;
    TIERMEM_RETURN_IF_ERROR(m_trace.write(path, m_env.rank));
  }
  return Status();
}

int train(const TrainOptions& options, const RankEnv& env) {
  Trainer trainer(options, env);
  Status s = trainer.run();
  if (!s.ok()) {
    std::fprintf(stderr, "tiermem-exec rank %d: %s\n", env.rank, s.to_string().c_str());
    return 1;
  }
  return 0;
}

}  // namespace tiermem::exec
