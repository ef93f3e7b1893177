#include "client/client_core.hpp"

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>

#include "convert.hpp"
#include "mapping/page_table.hpp"
#include "mapping/version.hpp"

namespace tiermem::detail {
namespace {

constexpr auto k_lock_timeout = std::chrono::seconds(2);
constexpr int k_max_refreshes = 16;
constexpr const char* k_default_socket = "/run/tiermem/tiermemd.sock";

Status stale() { return Status(ErrorCode::not_found, "stale translation"); }

Status busy_page(const CachedAllocation& a, uint64_t index) {
  return Status(ErrorCode::busy, "page " + std::to_string(a.first_page + index) + " of " +
                                     a.base.to_string() + " stayed locked by another writer");
}

Status msync_range(std::byte* p, size_t length) {
  const auto page = static_cast<uintptr_t>(::sysconf(_SC_PAGESIZE));
  const auto start = reinterpret_cast<uintptr_t>(p) & ~(page - 1);
  const auto end = reinterpret_cast<uintptr_t>(p) + length;
  if (::msync(reinterpret_cast<void*>(start), end - start, MS_SYNC) != 0) {
    return Status(ErrorCode::io_error, std::string("msync of PMEM range: ") + std::strerror(errno));
  }
  return Status();
}

// The extent holding byte `offset` of the allocation.
const Extent* extent_at(const CachedAllocation& a, uint64_t offset) {
  auto it = std::upper_bound(a.extents.begin(), a.extents.end(), offset,
                             [](uint64_t o, const Extent& x) { return o < x.gva_offset; });
  if (it == a.extents.begin()) return nullptr;
  --it;
  return offset < it->gva_offset + it->length ? &*it : nullptr;
}

}  // namespace

Result<std::shared_ptr<ClientCore>> ClientCore::connect(const ClientOptions& options) {
  std::string path = options.socket_path;
  if (path.empty()) {
    const char* env = std::getenv("TIERMEM_SOCKET");
    path = env != nullptr && *env != '\0' ? env : k_default_socket;
  }
  auto connection = Connection::open(path, options.client_name);
  if (!connection.ok()) return connection.status();
  return std::shared_ptr<ClientCore>(new ClientCore(std::move(connection).value(), options.direct_access));
}

Status ClientCore::open_regions() {
  std::call_once(m_regions_once, [this] {
    proto::Request request;
    request.mutable_open_regions();
    std::vector<UniqueFd> fds;
    auto response = m_connection->call(request, &fds);
    if (!response.ok()) {
      m_regions_status = response.status();
      return;
    }
    size_t next_fd = 0;
    for (const proto::Region& r : response->open_regions().regions()) {
      if (!r.has_fd()) continue;
      if (next_fd >= fds.size()) {
        m_regions_status = Status(ErrorCode::internal, "tiermemd sent fewer descriptors than regions");
        return;
      }
      UniqueFd fd = std::move(fds[next_fd++]);
      auto map = MappedRegion::map(fd.get(), r.length());
      if (!map.ok()) {
        m_regions_status = map.status().with_context("mapping a tier region");
        return;
      }
      if (r.kind() == proto::Region::VERSIONS) {
        m_versions = std::move(map).value();
      } else if (r.kind() == proto::Region::SUB_BLOCKS) {
        m_sub_blocks = std::move(map).value();
      } else {
        LocalRegion& region = m_regions[static_cast<size_t>(wire::from_proto(r.tier()))];
        region.fd = std::move(fd);
        region.map = std::move(map).value();
        region.persistent = r.persistent();
      }
    }
  });
  return m_regions_status;
}

Result<int> ClientCore::region_fd(Tier tier) {
  Status s = open_regions();
  if (!s.ok()) return s;
  const LocalRegion& r = m_regions[static_cast<size_t>(tier)];
  if (!r.fd.valid()) {
    return Status(ErrorCode::not_supported,
                  std::string("the ") + std::string(tier_name(tier)) +
                      " tier cannot be mapped into a client process");
  }
  return r.fd.get();
}

bool ClientCore::region_persistent(Tier tier) const {
  return m_regions[static_cast<size_t>(tier)].persistent;
}

Result<std::shared_ptr<const CachedAllocation>> ClientCore::cached(Gva gva, bool refresh) {
  if (!refresh) {
    std::shared_lock lock(m_cache_mutex);
    auto it = m_cache.upper_bound(gva.offset);
    if (it != m_cache.begin()) {
      const auto& a = std::prev(it)->second;
      const bool inside = a->base.node == gva.node &&
                          gva.offset < a->base.offset + a->page_versions.size() * page_size();
      if (inside && (gva.generation == 0 || gva.generation == a->base.generation)) return a;
    }
  }
  proto::Request request;
  wire::to_proto(gva, request.mutable_translate()->mutable_gva());
  auto response = m_connection->call(request);
  if (!response.ok()) {
    if (response.status().code() == ErrorCode::not_allocated) forget(gva);
    return response.status();
  }
  const proto::TranslateResponse& t = response->translate();
  auto a = std::make_shared<CachedAllocation>();
  const AllocationInfo info = wire::from_proto(t.allocation());
  a->base = info.gva;
  a->size = info.size;
  a->tier = info.tier;
  a->first_page = t.first_page_index();
  for (const auto& x : t.extents()) a->extents.push_back(wire::from_proto(x));
  a->page_versions.assign(t.page_versions().begin(), t.page_versions().end());
  std::unique_lock lock(m_cache_mutex);
  m_cache[a->base.offset] = a;
  return std::shared_ptr<const CachedAllocation>(a);
}

void ClientCore::forget(Gva gva) {
  std::unique_lock lock(m_cache_mutex);
  auto it = m_cache.upper_bound(gva.offset);
  if (it != m_cache.begin()) m_cache.erase(std::prev(it));
}

void ClientCore::mark_written(uint64_t page, uint64_t offset, uint64_t length, bool dirty) {
  const size_t word = page * k_l3_words_per_page;
  if ((word + k_l3_words_per_page) * sizeof(uint64_t) > m_sub_blocks.size()) return;
  mark_sub_blocks(reinterpret_cast<uint64_t*>(m_sub_blocks.data()) + word, page_size(), offset,
                  length, dirty);
}

bool ClientCore::can_copy_direct(const CachedAllocation& a) const {
  if (!m_direct || a.base.node != node() || m_versions.data() == nullptr) return false;
  const LocalRegion& r = m_regions[static_cast<size_t>(a.tier)];
  return r.map.data() != nullptr &&
         (a.first_page + a.page_versions.size()) * sizeof(uint64_t) <= m_versions.size();
}

// A run is a stretch of an allocation inside one physically contiguous
// extent: it is copied with one memcpy (large copies take the streaming-store
// path of memcpy, which per-page copies of 2 MiB would not), under the locks
// or version snapshots of all its pages, taken in ascending page order (the
// order every writer and the daemon use, so writers cannot deadlock).
Status ClientCore::copy_direct(const CachedAllocation& a, uint64_t offset, std::byte* buf,
                               size_t length, bool to_memory) {
  constexpr uint64_t k_max_run = 64 << 20;
  const LocalRegion& region = m_regions[static_cast<size_t>(a.tier)];
  while (length > 0) {
    const Extent* x = extent_at(a, offset);
    if (x == nullptr) return stale();
    const uint64_t in_extent = offset - x->gva_offset;
    const size_t n = std::min<uint64_t>({length, x->length - in_extent, k_max_run});
    if (x->frame_offset + in_extent + n > region.map.size()) return stale();
    Run run{a, offset, n, region.map.data() + x->frame_offset + in_extent, buf};
    Status s = to_memory ? write_run(run, region.persistent) : read_run(run);
    if (!s.ok()) return s;
    buf += n;
    offset += n;
    length -= n;
  }
  return Status();
}

Status ClientCore::write_run(const Run& run, bool persistent) {
  const uint64_t psize = page_size();
  auto* words = reinterpret_cast<uint64_t*>(m_versions.data()) + run.alloc.first_page;
  const uint64_t first = run.offset / psize, last = (run.offset + run.length - 1) / psize;
  uint64_t locked_buf[32];
  std::vector<uint64_t> locked_vec;
  uint64_t* locked = locked_buf;
  if (last - first + 1 > std::size(locked_buf)) {
    locked_vec.resize(last - first + 1);
    locked = locked_vec.data();
  }
  auto unlock_until = [&](uint64_t end) {
    for (uint64_t p = first; p < end; ++p) version::unlock(words[p], locked[p - first]);
  };
  for (uint64_t p = first; p <= last; ++p) {
    const uint16_t epoch = version::epoch_of(run.alloc.page_versions[p]);
    version::SpinWait wait(k_lock_timeout);
    uint64_t v = version::load(words[p]);
    for (;;) {
      if (version::epoch_of(v) != epoch) {
        unlock_until(p);
        return stale();
      }
      if (version::try_lock(words[p], &v)) break;
      if (!wait.again()) {
        unlock_until(p);
        return busy_page(run.alloc, p);
      }
      v = version::load(words[p]);
    }
    locked[p - first] = v + 1;
  }
  std::memcpy(run.memory, run.buffer, run.length);
  Status s = persistent ? msync_range(run.memory, run.length) : Status();
  if (s.ok()) {
    for (uint64_t p = first; p <= last; ++p) {
      const uint64_t from = std::max(run.offset, p * psize);
      const uint64_t to = std::min(run.offset + run.length, (p + 1) * psize);
      mark_written(run.alloc.first_page + p, from - p * psize, to - from, !persistent);
    }
  }
  unlock_until(last + 1);
  return s;
}

Status ClientCore::read_run(const Run& run) {
  const uint64_t psize = page_size();
  auto* words = reinterpret_cast<uint64_t*>(m_versions.data()) + run.alloc.first_page;
  const uint64_t first = run.offset / psize, last = (run.offset + run.length - 1) / psize;
  uint64_t start_buf[32];
  std::vector<uint64_t> start_vec;
  uint64_t* start = start_buf;
  if (last - first + 1 > std::size(start_buf)) {
    start_vec.resize(last - first + 1);
    start = start_vec.data();
  }
  version::SpinWait wait(k_lock_timeout);
  for (;;) {
    uint64_t locked_page = ~uint64_t{0};
    for (uint64_t p = first; p <= last; ++p) {
      const uint64_t v = version::load(words[p]);
      if (version::epoch_of(v) != version::epoch_of(run.alloc.page_versions[p])) return stale();
      if (version::is_locked(v)) {
        locked_page = p;
        break;
      }
      start[p - first] = v;
    }
    if (locked_page == ~uint64_t{0}) {
      std::memcpy(run.buffer, run.memory, run.length);
      bool unchanged = true;
      for (uint64_t p = first; p <= last && unchanged; ++p) {
        unchanged = version::read_validate(words[p], start[p - first]);
      }
      if (unchanged) return Status();
      locked_page = first;
    }
    if (!wait.again()) return busy_page(run.alloc, locked_page);
  }
}

Status ClientCore::copy_rpc(Gva gva, std::byte* buf, size_t length, bool to_memory) {
  const uint64_t chunk = std::max<uint64_t>(4096, m_connection->hello().max_inline_bytes());
  while (length > 0) {
    const size_t n = std::min<uint64_t>(length, chunk);
    proto::Request request;
    if (to_memory) {
      wire::to_proto(gva, request.mutable_write()->mutable_gva());
      request.mutable_write()->set_data(buf, n);
    } else {
      wire::to_proto(gva, request.mutable_read()->mutable_gva());
      request.mutable_read()->set_length(n);
    }
    auto response = m_connection->call(request);
    if (!response.ok()) return response.status();
    if (!to_memory) {
      const std::string& data = response->read().data();
      if (data.size() != n) return Status(ErrorCode::internal, "tiermemd returned a short read");
      std::memcpy(buf, data.data(), n);
    }
    buf += n;
    gva.offset += n;
    length -= n;
  }
  return Status();
}

Status ClientCore::copy(Gva gva, std::byte* buf, size_t length, bool to_memory) {
  if (length == 0) return Status();
  if (m_direct && gva.node == node()) {
    Status s = open_regions();
    if (!s.ok()) return s;
  }
  bool refresh = false;
  for (int attempt = 0; attempt < k_max_refreshes; ++attempt) {
    auto a = cached(gva, refresh);
    if (!a.ok()) return a.status();
    const CachedAllocation& alloc = **a;
    const uint64_t offset = gva.offset - alloc.base.offset;
    if (offset > alloc.size || length > alloc.size - offset) {
      return Status(ErrorCode::out_of_range,
                    std::string(to_memory ? "write" : "read") + " of " + std::to_string(length) +
                        " bytes at " + gva.to_string() + " (offset " + std::to_string(offset) +
                        ") runs past the end of allocation " + alloc.base.to_string() + " of " +
                        std::to_string(alloc.size) + " bytes");
    }
    if (!can_copy_direct(alloc)) return copy_rpc(gva, buf, length, to_memory);
    Status s = copy_direct(alloc, offset, buf, length, to_memory);
    if (s.code() != ErrorCode::not_found) return s;
    refresh = true;  // stale: the allocation moved, was freed, or was replaced
    // Bytes before the page that went stale were copied; copying them again
    // is harmless, so restart the range for simplicity.
  }
  return Status(ErrorCode::busy, "translation of " + gva.to_string() +
                                     " kept changing; the allocation is being migrated or freed");
}

Status ClientCore::write(Gva gva, const void* src, size_t length) {
  return copy(gva, static_cast<std::byte*>(const_cast<void*>(src)), length, true);
}

Status ClientCore::read(Gva gva, void* dst, size_t length) {
  return copy(gva, static_cast<std::byte*>(dst), length, false);
}

}  // namespace tiermem::detail
