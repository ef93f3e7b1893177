// Who holds a lock on a file: for messages that tell an operator which
// process to look at when a file is in use ("in use by another tiermemd
// (pid 4242)").
#pragma once

#include <sys/types.h>

#include <string>

namespace tiermem {

struct LockHolder {
  pid_t pid = 0;        // 0: unknown
  std::string command;  // its /proc/<pid>/comm ("tiermemd"); empty when unknown
};

// The process holding a flock() on `path`, from /proc/locks (as this
// process's pid namespace numbers it). {} when none is found or /proc
// cannot say. Thread-safe.
LockHolder flock_holder(const std::string& path);

}  // namespace tiermem
