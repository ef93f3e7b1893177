#include "executor/runtime/state/peers.hpp"

#include <cstdio>

#include <tiermem/status_macros.h>

namespace tiermem::exec {

Result<RankPeers> find_peers(JobDirectory& dir, const JobPlan& job, const Arenas& arenas, bool announce) {
  RankPeers peers;
  const int world = job.topo.world();
  for (int r = 0; r < world; ++r) {
    if (r == job.topo.rank) {
      peers.ctl[r] = arenas.ctl_region().gva;
      continue;
    }
    if (announce) std::fprintf(stderr, "rank %d: waiting for rank %d\n", job.topo.rank, r);
    TIERMEM_ASSIGN_OR_RETURN(peers.ctl[r], dir.peer(r, "ctl"));
  }
  for (const Channel& c : job.channels) {
    if (c.from != job.topo.stage()) continue;
    TIERMEM_ASSIGN_OR_RETURN(peers.mbox[c.id], dir.peer(job.topo.rank_of(c.to, job.topo.replica()), "mbox"));
  }
  for (int t = 0; t < job.topo.tensor_parallel; ++t) {
    if (t == job.topo.tp()) continue;
    TIERMEM_ASSIGN_OR_RETURN(peers.tp_mbox[job.topo.tp_peer(t)], dir.peer(job.topo.tp_peer(t), "mbox"));
  }
  return peers;
}

}  // namespace tiermem::exec
