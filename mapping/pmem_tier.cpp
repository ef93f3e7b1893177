// PMEM tier: a pool file mapped with libpmem2. On a DAX file system stores are
// made durable with cache flushes; on an ordinary file libpmem2 falls back to
// msync (we accept page store granularity so both work with the same code).
#include <fcntl.h>
#include <libpmem2.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include <tiermem/status_macros.h>

#include "common/shared_memory.hpp"
#include "common/unique_fd.hpp"
#include "mapping/tier_backend.hpp"

namespace tiermem {
namespace {

Status pmem2_error(const std::string& what) {
  return Status(ErrorCode::io_error, what + ": " + pmem2_errormsg());
}

class PmemTier final : public TierBackend {
 public:
  PmemTier(UniqueFd fd, pmem2_map* map, std::string path)
      : m_fd(std::move(fd)),
        m_map(map),
        m_path(std::move(path)),
        m_base(static_cast<std::byte*>(pmem2_map_get_address(map))),
        m_size(pmem2_map_get_size(map)),
        m_persist(pmem2_get_persist_fn(map)),
        m_memcpy(pmem2_get_memcpy_fn(map)) {}
  ~PmemTier() override { pmem2_map_delete(&m_map); }

  Tier tier() const override { return Tier::pmem; }
  uint64_t capacity() const override { return m_size; }
  bool persistent() const override { return true; }
  std::string backing() const override { return m_path; }
  std::byte* host_base() const override { return m_base; }
  void* region_base() const override { return m_base; }
  int share_fd() const override { return m_fd.get(); }

  Status write(uint64_t offset, const void* src, size_t length) override {
    m_memcpy(m_base + offset, src, length, 0);  // flags 0: copy, then persist
    return Status();
  }
  Status read(uint64_t offset, void* dst, size_t length) const override {
    std::memcpy(dst, m_base + offset, length);
    return Status();
  }
  Status persist(uint64_t offset, size_t length) override {
    m_persist(m_base + offset, length);
    return Status();
  }
  Status discard(uint64_t offset, size_t length) override {
    return punch_hole(m_fd.get(), offset, length, m_base);
  }

 private:
  UniqueFd m_fd;
  pmem2_map* m_map;
  std::string m_path;
  std::byte* m_base;
  size_t m_size;
  pmem2_persist_fn m_persist;
  pmem2_memcpy_fn m_memcpy;
};

Status io_error(const std::string& what) {
  return Status(ErrorCode::io_error, what + ": " + std::strerror(errno));
}

// Opens (creating if needed) the pool file and grows it to `capacity`.
Result<UniqueFd> open_pool(const PmemTierOptions& options) {
  UniqueFd fd(::open(options.path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600));
  if (!fd.valid()) {
    return io_error("opening PMEM pool " + options.path +
                    " (check that its directory exists and is writable)");
  }
  struct stat st {};
  if (::fstat(fd.get(), &st) != 0) return io_error("stat of PMEM pool " + options.path);
  if (static_cast<uint64_t>(st.st_size) < options.capacity &&
      ::ftruncate(fd.get(), static_cast<off_t>(options.capacity)) != 0) {
    return io_error("growing PMEM pool " + options.path + " to " +
                    std::to_string(options.capacity) + " bytes");
  }
  return fd;
}

}  // namespace

Result<std::unique_ptr<TierBackend>> make_pmem_tier(const PmemTierOptions& options) {
  if (options.path.empty()) return Status(ErrorCode::invalid_argument, "PMEM tier needs a pool path");
  TIERMEM_ASSIGN_OR_RETURN(auto fd, open_pool(options));

  pmem2_source* source = nullptr;
  pmem2_config* config = nullptr;
  pmem2_map* map = nullptr;
  Status status;
  if (pmem2_source_from_fd(&source, fd.get()) != 0) {
    status = pmem2_error("PMEM pool " + options.path);
  } else if (pmem2_config_new(&config) != 0 ||
             pmem2_config_set_required_store_granularity(config, PMEM2_GRANULARITY_PAGE) != 0 ||
             pmem2_config_set_length(config, options.capacity) != 0) {
    status = pmem2_error("configuring the mapping of " + options.path);
  } else if (pmem2_map_new(&map, config, source) != 0) {
    status = pmem2_error("mapping PMEM pool " + options.path);
  }
  if (config != nullptr) pmem2_config_delete(&config);
  if (source != nullptr) pmem2_source_delete(&source);
  if (!status.ok()) return status;
  return std::unique_ptr<TierBackend>(new PmemTier(std::move(fd), map, options.path));
}

}  // namespace tiermem
