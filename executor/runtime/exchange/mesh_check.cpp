#include "executor/runtime/exchange/mesh_check.hpp"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cinttypes>
#include <cstdio>
#include <cstring>
#include <map>
#include <random>
#include <sstream>
#include <vector>

#include <tiermem/status_macros.h>

namespace tiermem::exec {
namespace {

constexpr int k_mesh_floats = 256;  // 1 KiB
constexpr int k_latency_rounds = 50;

uint64_t fnv(const void* data, size_t n) {
  uint64_t h = 1469598103934665603ull;
  for (size_t i = 0; i < n; ++i) {
    h ^= static_cast<const unsigned char*>(data)[i];
    h *= 1099511628211ull;
  }
  return h;
}

// (name, "shape dtype") of every line, in the order of the text.
std::vector<std::pair<std::string, std::string>> parse_boundary(const std::string& text) {
  std::vector<std::pair<std::string, std::string>> out;
  std::istringstream in(text);
  std::string name, rest;
  while (in >> name && std::getline(in, rest)) out.emplace_back(name, rest);
  return out;
}

int world_of(const JobPlan& job) { return job.topo.world(); }

Result<Gva> info_of(JobDirectory& dir, const JobPlan& job, const Arenas& arenas, int rank) {
  if (rank == job.topo.rank) return arenas.info().gva;
  return dir.peer(rank, "info");
}

// Phase 1: every rank's random tensor, summed in rank order; phase 2: every
// rank's hash of the sum. Returns this rank's hash.
Result<uint64_t> all_reduce_hash(Client& client, JobDirectory& dir, const JobPlan& job, const Arenas& arenas,
                                 const RankPeers& peers, uint64_t seed) {
  auto* mesh = reinterpret_cast<float*>(arenas.info().data() + k_info_mesh);
  std::mt19937 rng(static_cast<uint32_t>(seed * 7919 + static_cast<uint64_t>(job.topo.rank)));
  std::uniform_real_distribution<float> u(-1, 1);
  for (int i = 0; i < k_mesh_floats; ++i) mesh[i] = u(rng);
  uint64_t* ctl = arenas.ctl();
  std::atomic_ref<uint64_t>(ctl[k_mesh]).store(std::max<uint64_t>(load_local(ctl + k_mesh), 1));
  std::vector<float> sum(k_mesh_floats, 0.0f), theirs(k_mesh_floats);
  for (int r = 0; r < world_of(job); ++r) {
    TIERMEM_RETURN_IF_ERROR(dir.wait_at_least(peers.ctl_word(r, k_mesh), 1, "rank " + std::to_string(r) + " to join the mesh check"));
    TIERMEM_ASSIGN_OR_RETURN(auto info, info_of(dir, job, arenas, r));
    TIERMEM_RETURN_IF_ERROR(client.read(info.plus(k_info_mesh), theirs.data(), k_mesh_floats * 4));
    for (int i = 0; i < k_mesh_floats; ++i) sum[i] += theirs[i];
  }
  const uint64_t hash = fnv(sum.data(), sum.size() * 4);
  std::memcpy(arenas.info().data() + k_info_hash, &hash, 8);
  std::atomic_ref<uint64_t>(ctl[k_mesh]).store(2);
  for (int r = 0; r < world_of(job); ++r) {
    TIERMEM_RETURN_IF_ERROR(dir.wait_at_least(peers.ctl_word(r, k_mesh), 2, "rank " + std::to_string(r) + "'s mesh hash"));
    TIERMEM_ASSIGN_OR_RETURN(auto info, info_of(dir, job, arenas, r));
    uint64_t theirs_hash = 0;
    TIERMEM_RETURN_IF_ERROR(client.read(info.plus(k_info_hash), &theirs_hash, 8));
    if (theirs_hash != hash) {
      return Status(ErrorCode::internal, "mesh validation failed: the all-reduced 1 KiB tensor hashes to " +
                                             std::to_string(hash) + " on rank " + std::to_string(job.topo.rank) +
                                             " but " + std::to_string(theirs_hash) + " on rank " + std::to_string(r));
    }
  }
  return hash;
}

// Rank 0 rings every other rank k_latency_rounds times; returns its round
// trips (empty on the other ranks).
Result<std::vector<double>> ping_pong(JobDirectory& dir, const JobPlan& job, const Arenas& arenas,
                                      const RankPeers& peers, std::chrono::milliseconds timeout) {
  std::vector<double> rtt;
  uint64_t* ctl = arenas.ctl();
  if (job.topo.rank != 0) {
    for (uint64_t i = 1; i <= k_latency_rounds; ++i) {
      TIERMEM_RETURN_IF_ERROR(wait_local(ctl + k_ping, i, timeout, "rank 0's ping"));
      TIERMEM_RETURN_IF_ERROR(dir.raise(peers.ctl_word(0, k_pong + static_cast<size_t>(job.topo.rank)), i));
    }
    return rtt;
  }
  for (int r = 1; r < world_of(job); ++r) {
    for (uint64_t i = 1; i <= k_latency_rounds; ++i) {
      const auto t0 = std::chrono::steady_clock::now();
      TIERMEM_RETURN_IF_ERROR(dir.raise(peers.ctl_word(r, k_ping), i));
      TIERMEM_RETURN_IF_ERROR(wait_local(ctl + k_pong + r, i, timeout, "rank " + std::to_string(r) + "'s pong"));
      rtt.push_back(std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count());
    }
  }
  return rtt;
}

}  // namespace

std::string boundary_text(const JobPlan& job) {
  std::string out;
  for (const Channel& c : job.channels) {
    if (c.from != job.topo.stage() && c.to != job.topo.stage()) continue;
    const Tensor& t = job.graph.tensors[c.tensor];
    out += t.name + " " + shape_text(t.shape) + " " + (t.dtype == DType::f32 ? "f32" : "i32") + "\n";
  }
  return out;
}

void publish_boundary(const JobPlan& job, const Arenas& arenas) {
  const std::string text = boundary_text(job);
  const uint64_t length = text.size();
  std::memcpy(arenas.info().data(), &length, 8);
  std::memcpy(arenas.info().data() + 8, text.data(), std::min<size_t>(text.size(), k_info_mesh - 8));
}

Status check_shapes(Client& client, JobDirectory& dir, const JobPlan& job) {
  std::map<std::string, std::string> mine;
  for (auto& [name, shape] : parse_boundary(boundary_text(job))) mine[name] = shape;
  for (int r = 0; r < world_of(job); ++r) {
    if (r == job.topo.rank) continue;
    TIERMEM_ASSIGN_OR_RETURN(auto info, dir.peer(r, "info"));
    uint64_t length = 0;
    TIERMEM_RETURN_IF_ERROR(client.read(info, &length, 8));
    std::string text(std::min<uint64_t>(length, k_info_mesh - 8), '\0');
    TIERMEM_RETURN_IF_ERROR(client.read(info.plus(8), text.data(), text.size()));
    for (const auto& [name, shape] : parse_boundary(text)) {
      auto it = mine.find(name);
      if (it == mine.end() || it->second == shape) continue;
      return Status(ErrorCode::failed_precondition,
                    "Gradient topology mismatch: boundary tensor '" + name + "' is" + it->second + " on rank " +
                        std::to_string(job.topo.rank) + " (stage " + std::to_string(job.topo.stage()) + ") but" +
                        shape + " on rank " + std::to_string(r) + "; every rank must load the same model");
    }
  }
  return Status();
}

Status validate_mesh(Client& client, JobDirectory& dir, const JobPlan& job, const Arenas& arenas,
                     const RankPeers& peers, const TrainOptions& options, bool resumed) {
  TIERMEM_ASSIGN_OR_RETURN(const uint64_t hash, all_reduce_hash(client, dir, job, arenas, peers, options.seed));
  std::vector<double> rtt;
  if (!resumed && world_of(job) > 1) {
    TIERMEM_ASSIGN_OR_RETURN(rtt, ping_pong(dir, job, arenas, peers, options.timeout));
  }
  if (job.topo.rank == 0 && !options.quiet) {
    std::sort(rtt.begin(), rtt.end());
    std::printf("mesh validation: 1 KiB all-reduce over %d rank(s) agrees (hash %016" PRIx64 ")", world_of(job), hash);
    if (!rtt.empty()) std::printf("; send/receive round trip p50 %.1f us, max %.1f us", rtt[rtt.size() / 2], rtt.back());
    std::printf("\n");
  }
  return Status();
}

}  // namespace tiermem::exec
