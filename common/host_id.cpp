#include "common/host_id.hpp"

#include <unistd.h>

#include <array>
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <iterator>

namespace tiermem {
namespace {

std::string first_line(const char* path) {
  std::ifstream in(path);
  std::string line;
  std::getline(in, line);
  return line;
}

std::string link_of(const char* path) {
  std::array<char, 256> buf{};
  const ssize_t n = ::readlink(path, buf.data(), buf.size() - 1);
  return n > 0 ? std::string(buf.data(), static_cast<size_t>(n)) : std::string();
}

// FNV-1a: an identity, not a secret (a daemon on another host that claims
// ours gets nothing: the files are handed over by the daemon that owns them,
// after checking who asks).
uint64_t fnv1a(const std::string& text) {
  uint64_t h = 0xcbf29ce484222325ULL;
  for (unsigned char c : text) {
    h ^= c;
    h *= 0x100000001b3ULL;
  }
  return h;
}

std::string compute() {
  const std::string boot = first_line("/proc/sys/kernel/random/boot_id");
  const std::string mnt = link_of("/proc/self/ns/mnt");
  const std::string net = link_of("/proc/self/ns/net");
  if (boot.empty() || mnt.empty() || net.empty()) return {};
  const std::string machine = first_line("/etc/machine-id");
  char hex[17];
  std::snprintf(hex, sizeof hex, "%016llx",
                static_cast<unsigned long long>(fnv1a(boot + "/" + machine + "/" + mnt + "/" + net)));
  return hex;
}

}  // namespace

const std::string& host_id() {
  static const std::string id = compute();
  return id;
}

}  // namespace tiermem
