// The queues that processes killed by SIGKILL left behind. libfabric's shm
// provider keeps each endpoint's queue in a file of /dev/shm named
// "<pid>:<domain>:<endpoint>" (16 MiB here) and unlinks it when the
// endpoint closes or the process takes SIGINT or SIGTERM; after a SIGKILL
// nothing removes it, and a host whose clients crash fills its /dev/shm.
// Every shm transport sweeps at its start and its progress thread every
// 30 s (once per process): files of that pattern, of this process's user,
// whose pid no process has. Not swept: other users' (not ours to remove),
// and queues of a pid alive again (recycled; rare, and swept once it is
// gone). Processes of another pid namespace sharing /dev/shm would be
// misjudged: tiermem's shm peers must share one (they are watched by pid
// too, OfiEndpoint::m_pidfd).
#pragma once

#include <cstdint>
#include <string>

namespace tiermem::ofi_detail {

struct ShmSweep {
  uint64_t files = 0;
  uint64_t bytes = 0;  // what they held (allocated blocks)
};

// Removes the dead processes' queues from `dir` (/dev/shm); what it removed.
ShmSweep sweep_dead_shm_queues(const std::string& dir);
// The same on /dev/shm, at most once per 30 s in this process (else nothing).
ShmSweep sweep_dead_shm_queues_now_and_then();

}  // namespace tiermem::ofi_detail
