#include "transport/ofi/ofi_shm_files.hpp"

#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cctype>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <memory>

#include "common/unique_fd.hpp"

namespace tiermem::ofi_detail {

namespace {

// Shorter than any queue the provider makes (16 MiB with its defaults; its
// header alone is a few KiB): reading the header of a shorter file faults.
constexpr off_t k_min_queue_bytes = 64 << 10;

std::string_view without_scheme(std::string_view name) {
  if (name.starts_with(k_shm_scheme)) name.remove_prefix(k_shm_scheme.size());
  return name;
}

// Digits of `text` from `*at`, as a pid; false when there are none or too many.
bool read_pid(std::string_view text, size_t* at, long* pid) {
  const size_t start = *at;
  *pid = 0;
  while (*at < text.size() && text[*at] >= '0' && text[*at] <= '9' && *pid < (1L << 31)) {
    *pid = *pid * 10 + (text[*at] - '0');
    ++*at;
  }
  return *at > start && *pid > 0 && *pid < (1L << 31);
}

std::string mode_text(mode_t mode) {
  char text[8];
  std::snprintf(text, sizeof text, "%04o", static_cast<unsigned>(mode & 07777));
  return text;
}

}  // namespace

Result<std::string> fresh_shm_queue_name() {
  for (int attempt = 0; attempt < 4; ++attempt) {
    unsigned char bytes[16];
    if (::getrandom(bytes, sizeof bytes, 0) != static_cast<ssize_t>(sizeof bytes)) {
      return Status(ErrorCode::io_error, std::string("no random bytes for an shm queue name: ") + std::strerror(errno));
    }
    std::string name = "tm-" + std::to_string(::getpid()) + "-";
    static constexpr char k_hex[] = "0123456789abcdef";
    for (unsigned char b : bytes) {
      name += k_hex[b >> 4];
      name += k_hex[b & 15];
    }
    struct stat st {};
    if (::lstat(("/dev/shm/" + name).c_str(), &st) != 0 && errno == ENOENT) return std::string(k_shm_scheme) + name;
  }
  return Status(ErrorCode::io_error, "four random shm queue names were all taken in /dev/shm");
}

pid_t pid_of_shm_queue(std::string_view name) {
  name = without_scheme(name);
  long pid = 0;
  size_t at = 0;
  if (name.starts_with("tm-")) {
    at = 3;
    if (!read_pid(name, &at, &pid) || at >= name.size() || name[at] != '-' || name.size() - at - 1 != 32) return 0;
    for (size_t i = at + 1; i < name.size(); ++i) {
      if (!std::isxdigit(static_cast<unsigned char>(name[i]))) return 0;
    }
    return static_cast<pid_t>(pid);
  }
  // The provider's own: "<pid>:<uid>:<n>".
  long uid = 0, n = 0;
  if (!read_pid(name, &at, &pid) || at >= name.size() || name[at++] != ':') return 0;
  const size_t uid_at = at;
  while (at < name.size() && name[at] >= '0' && name[at] <= '9') uid = uid * 10 + (name[at++] - '0');
  if (at == uid_at || at >= name.size() || name[at++] != ':') return 0;
  const size_t n_at = at;
  while (at < name.size() && name[at] >= '0' && name[at] <= '9') n = n * 10 + (name[at++] - '0');
  if (at == n_at || at != name.size()) return 0;
  (void)uid;
  (void)n;
  return static_cast<pid_t>(pid);
}

Status check_shm_queue(std::string_view name, const std::string& dir) {
  const std::string base(without_scheme(name));
  if (base.empty() || base.find('/') != std::string::npos || base == "." || base == "..") {
    return Status(ErrorCode::invalid_argument, "'" + std::string(name.substr(0, 80)) + "' is not an shm queue name");
  }
  const std::string path = dir + "/" + base;
  // O_NONBLOCK: a FIFO planted under the name must not block the open.
  UniqueFd fd(::open(path.c_str(), O_RDONLY | O_NOFOLLOW | O_CLOEXEC | O_NONBLOCK));
  if (!fd.valid()) {
    // Gone: its process exited (or was killed and swept), not a queue to
    // refuse; the caller treats it as a peer that is down.
    if (errno == ENOENT) return Status(ErrorCode::connection_failed, "shm queue " + path + " does not exist");
    return Status(ErrorCode::not_supported, "shm queue " + path + " cannot be opened: " + std::strerror(errno));
  }
  struct stat st {};
  if (::fstat(fd.get(), &st) != 0) {
    return Status(ErrorCode::not_supported, "shm queue " + path + ": fstat: " + std::strerror(errno));
  }
  const std::string whose = " (owner uid " + std::to_string(st.st_uid) + ", mode " + mode_text(st.st_mode) + ")";
  if (!S_ISREG(st.st_mode)) {
    return Status(ErrorCode::not_supported, "shm queue " + path + " is not a regular file" + whose);
  }
  if (st.st_uid != ::geteuid()) {
    return Status(ErrorCode::not_supported, "shm queue " + path + " belongs to another user" + whose +
                                                "; shm peers are processes of this process's user (uid " +
                                                std::to_string(::geteuid()) + ")");
  }
  if ((st.st_mode & 077) != 0) {
    return Status(ErrorCode::not_supported,
                  "shm queue " + path + " is open to other users" + whose + "; the provider makes queues 0600");
  }
  if (st.st_size < k_min_queue_bytes) {
    return Status(ErrorCode::not_supported, "shm queue " + path + " holds " + std::to_string(st.st_size) +
                                                " bytes, too few for a queue" + whose);
  }
  return Status();
}

ShmSweep sweep_dead_shm_queues(const std::string& dir) {
  ShmSweep swept;
  std::unique_ptr<DIR, int (*)(DIR*)> d(::opendir(dir.c_str()), ::closedir);
  if (d == nullptr) return swept;
  const int fd = ::dirfd(d.get());
  const uid_t me = ::geteuid();
  while (const dirent* e = ::readdir(d.get())) {
    const pid_t pid = pid_of_shm_queue(e->d_name);
    if (pid == 0) continue;
    struct stat st {};
    if (::fstatat(fd, e->d_name, &st, AT_SYMLINK_NOFOLLOW) != 0 || !S_ISREG(st.st_mode) || st.st_uid != me) continue;
    // Alive (or not ours to ask: EPERM): kept. Only a pid no process has.
    if (::kill(pid, 0) == 0 || errno != ESRCH) continue;
    if (::unlinkat(fd, e->d_name, 0) == 0) {
      ++swept.files;
      swept.bytes += static_cast<uint64_t>(st.st_blocks) * 512;
    }
  }
  return swept;
}

ShmSweep sweep_dead_shm_queues_now_and_then() {
  // One sweep per process at most every 30 s: a daemon's tenant planes each
  // have a progress thread that asks.
  static std::atomic<int64_t> last{0};
  const int64_t now =
      std::chrono::duration_cast<std::chrono::seconds>(std::chrono::steady_clock::now().time_since_epoch()).count();
  int64_t seen = last.load(std::memory_order_relaxed);
  if (seen != 0 && now - seen < 30) return {};
  if (!last.compare_exchange_strong(seen, now)) return {};
  return sweep_dead_shm_queues("/dev/shm");
}

}  // namespace tiermem::ofi_detail
