// Files the daemon maps and also hands to clients (a tenant's DRAM, PMEM and
// version-word files) can be truncated by any holder of their descriptor;
// the daemon's next access to the cut-off part would then raise SIGBUS and
// kill it. Memfds are sealed against that (SharedMemory); named files, which
// must outlive the daemon, cannot be sealed. So the daemon watches them: a
// SIGBUS at an address of a watched mapping whose file is now too short
// makes the handler extend the file to its size again (the cut-off part
// reads as zeros: the tenant who cut it lost it) and the access is retried.
// A fault on a page that gets no storage (a hole, and the file system full)
// makes it cut back watched files their tenants grew, and failing that put
// a private page under the address (see repair() in the .cpp).
// Any other SIGBUS (a media error on PMEM, say) goes on to the handler that
// was there before, or the default action.
#pragma once

#include <cstddef>
#include <cstdint>

#include <tiermem/status.h>

namespace tiermem {

class TruncationGuard {
 public:
  TruncationGuard() = default;
  TruncationGuard(TruncationGuard&& other) noexcept;
  TruncationGuard& operator=(TruncationGuard&& other) noexcept;
  TruncationGuard(const TruncationGuard&) = delete;
  TruncationGuard& operator=(const TruncationGuard&) = delete;
  ~TruncationGuard();

  // Watches `length` bytes at `start`, a shared mapping of `fd` from
  // `file_offset` on (the descriptor is duplicated: the caller may close
  // its own). Installs the handler on first use. Errors: busy (too many
  // watched mappings), io_error (dup, sigaction).
  static Result<TruncationGuard> watch(std::byte* start, size_t length, int fd, uint64_t file_offset);

  // Installs the handler again on top of any installed since (UCX installs
  // its own for SIGBUS when it starts); the one replaced is chained to.
  static Status install();
  // Times a file was found cut short and extended again.
  static uint64_t repairs();
  // Pages of watched files that could get no storage when the daemon touched
  // them (a hole its tenant punched, on a full file system, even after grown
  // files were cut back): the daemon sees a private page of zeros there
  // instead of dying.
  static uint64_t unbacked_pages();

 private:
  explicit TruncationGuard(int slot) : m_slot(slot) {}
  int m_slot = -1;
};

}  // namespace tiermem
