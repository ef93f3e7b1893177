// Which host a process runs on, as far as memory files are concerned: two
// processes with the same host id can hand each other file descriptors of
// shared memory over a Unix socket and map them (the same kernel, the same
// file systems, the same Unix socket namespace). It is the boot, the
// machine, and the mount and network namespaces: daemons in network
// namespaces of their own (the tests' hosts) count as other hosts.
#pragma once

#include <string>

namespace tiermem {

// Hex digits; empty when it cannot be known (then nothing is "the same host").
const std::string& host_id();

}  // namespace tiermem
