// libfabric's shm provider keeps each endpoint's queue in a file of
// /dev/shm and maps the queue of every peer it sends to. Two things about
// those files are ours to get right, because the provider trusts them:
//
// Names. By default the provider names a queue "<pid>:<uid>:<n>", which any
// local user can predict and create first: an empty file there makes the
// provider map it and die of SIGBUS reading its header, a taken name makes
// a restarted daemon fail with EBUSY. tiermem names every queue itself
// (fi_setname before fi_enable): "tm-<pid>-<128 random bits in hex>". The
// pid stays in the name (the sweep below and a target's watch of its
// askers read it); the random part makes the name impossible to guess
// before the file exists, and /dev/shm's sticky bit keeps anyone else from
// replacing it after.
//
// Checks. Before a queue is used, ours after the provider made it and a
// peer's before the provider maps it, the file is opened without following
// links and checked on the descriptor (fstat, never by path): a regular
// file, owned by this process's user (shm peers are processes of one user:
// the provider opens queues 0600), not open to group or others, and long
// enough to hold a queue. A file that fails is not used: the caller is told
// which file, whose it is and why (a peer then goes through its daemon).
//
// Sweep. A process killed by SIGKILL leaves its queue behind; every shm
// transport removes the queues of this user whose pid no process has, at its
// start and every 30 s from its progress thread (once per process). Not
// swept: other users' (not ours to remove), and queues of a pid alive again
// (recycled; rare, and swept once it is gone). Processes of another pid
// namespace sharing /dev/shm would be misjudged: tiermem's shm peers must
// share one (they are watched by pid too, OfiEndpoint::m_pidfd).
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <string>
#include <string_view>

#include <tiermem/status.h>

namespace tiermem::ofi_detail {

// The scheme of an shm address ("fi_shm://NAME"); the file is /dev/shm/NAME.
inline constexpr std::string_view k_shm_scheme = "fi_shm://";

// A fresh queue name for this process: "fi_shm://tm-<pid>-<32 hex digits>",
// none of /dev/shm's entries (tried again when one is, which takes a guess of
// 128 random bits). Errors: io_error when no random bytes can be had.
Result<std::string> fresh_shm_queue_name();

// The pid in a queue's name, with or without the scheme: ours
// ("tm-<pid>-<hex>") or the provider's default ("<pid>:<uid>:<n>"); 0 when
// it is neither.
pid_t pid_of_shm_queue(std::string_view name);

// Checks the queue file of `name` (with or without the scheme) in `dir`
// (/dev/shm) as described above. Errors: not_supported naming the file, its
// owner and mode, and what is wrong (missing, not a regular file, another
// user's, open to others, too short); invalid_argument for a name with a
// '/' or empty.
Status check_shm_queue(std::string_view name, const std::string& dir = "/dev/shm");

struct ShmSweep {
  uint64_t files = 0;
  uint64_t bytes = 0;  // what they held (allocated blocks)
};

// Removes the dead processes' queues from `dir` (/dev/shm); what it removed.
ShmSweep sweep_dead_shm_queues(const std::string& dir);
// The same on /dev/shm, at most once per 30 s in this process (else nothing).
ShmSweep sweep_dead_shm_queues_now_and_then();

}  // namespace tiermem::ofi_detail
