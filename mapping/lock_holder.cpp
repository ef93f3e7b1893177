#include "mapping/lock_holder.hpp"

#include <sys/stat.h>
#include <sys/sysmacros.h>

#include <cstdio>
#include <fstream>
#include <sstream>

namespace tiermem {

LockHolder flock_holder(const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) return {};
  // Lines such as "1: FLOCK  ADVISORY  WRITE 4242 00:1a:2491 0 EOF": the
  // device as major:minor in hex, then the inode. Waiters ("1: -> FLOCK")
  // hold nothing.
  char device[32];
  std::snprintf(device, sizeof device, "%02x:%02x:%llu", major(st.st_dev), minor(st.st_dev),
                static_cast<unsigned long long>(st.st_ino));
  std::ifstream locks("/proc/locks");
  std::string line;
  while (std::getline(locks, line)) {
    std::istringstream fields(line);
    std::string number, kind, mode, access, where;
    long pid = 0;
    if (!(fields >> number >> kind >> mode >> access >> pid >> where) || kind != "FLOCK" || where != device) continue;
    LockHolder holder;
    holder.pid = static_cast<pid_t>(pid);
    std::ifstream comm("/proc/" + std::to_string(pid) + "/comm");
    std::getline(comm, holder.command);
    return holder;
  }
  return {};
}

}  // namespace tiermem
