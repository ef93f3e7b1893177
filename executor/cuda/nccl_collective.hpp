// The CUDA compute's collectives (compute.hpp: Collective) through NCCL,
// inside the plugin. Communicators are non-blocking (ncclConfig_t blocking =
// 0): a join is polled, so that a member that never comes or a newer id is
// noticed, and a group whose member died can be aborted (ncclCommAbort)
// instead of hanging the process. The compute's sync() waits through the
// registry below, which watches every live group's errors and timeout.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <vector>

#include <cuda_runtime_api.h>

#include "executor/compute.hpp"

namespace tiermem::exec::nccl {

class Group;

// The live groups of one compute.
class Registry {
 public:
  void add(Group* g);
  void remove(Group* g);
  bool empty() const;
  // Waits until `main` (and `side`, when not null) and every group's own
  // stream are idle. A group that reports an error, or a wait past the
  // longest group timeout, aborts every group; returns what happened.
  Status wait_idle(cudaStream_t main, cudaStream_t side);

 private:
  mutable std::mutex m_mu;
  std::set<Group*> m_groups;
};

// Whether this build has NCCL; its version ("NCCL 2.28.9").
std::string library_version();
// Whether libnccl.so.2 loads and has what this build calls. Errors:
// not_supported, saying why.
Status available();
// A fresh ncclUniqueId's bytes. Errors: not_supported (no NCCL), io_error.
Result<std::string> unique_id();
// Starts joining; the group registers itself with `registry`.
Result<std::unique_ptr<Collective>> join(Registry& registry, cudaStream_t compute_stream, const std::string& id,
                                         int size, int rank, std::chrono::milliseconds timeout);

}  // namespace tiermem::exec::nccl
