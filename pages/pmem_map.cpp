#include "pages/pmem_map.hpp"

#include <libpmem2.h>

#include <type_traits>
#include <utility>

namespace tiermem {

static_assert(std::is_same_v<decltype(Durability::copy), pmem2_memcpy_fn>);
static_assert(std::is_same_v<decltype(Durability::persist), pmem2_persist_fn>);

void PmemMap::unmap() {
  if (m_map != nullptr) pmem2_map_delete(&m_map);
}

Result<PmemMap> PmemMap::map(int fd, uint64_t length, const std::string& what, pmem2_vm_reservation* reservation,
                             uint64_t offset) {
  pmem2_source* source = nullptr;
  pmem2_config* config = nullptr;
  pmem2_map* map = nullptr;
  std::string failed;
  if (pmem2_source_from_fd(&source, fd) != 0) {
    failed = "reading " + what + " as a PMEM source";
  } else if (pmem2_config_new(&config) != 0 ||
             pmem2_config_set_required_store_granularity(config, PMEM2_GRANULARITY_PAGE) != 0 ||
             pmem2_config_set_length(config, length) != 0 ||
             (reservation != nullptr && pmem2_config_set_vm_reservation(config, reservation, offset) != 0)) {
    failed = "configuring the mapping of " + what;
  } else if (pmem2_map_new(&map, config, source) != 0) {
    failed = "mapping " + what;
  }
  // libpmem2's message is per thread and read before anything else can call it.
  const std::string reason = failed.empty() ? std::string() : pmem2_errormsg();
  if (config != nullptr) pmem2_config_delete(&config);
  if (source != nullptr) pmem2_source_delete(&source);
  if (!failed.empty()) return Status(ErrorCode::io_error, failed + ": " + reason);
  PmemMap m;
  m.m_map = map;
  m.m_data = static_cast<std::byte*>(pmem2_map_get_address(map));
  m.m_size = pmem2_map_get_size(map);
  m.m_user_space = pmem2_map_get_store_granularity(map) != PMEM2_GRANULARITY_PAGE;
  m.m_copy = pmem2_get_memcpy_fn(map);
  m.m_persist = pmem2_get_persist_fn(map);
  return m;
}

Durability PmemMap::durability() const {
  if (!m_user_space) return {};
  return {m_copy, m_persist};
}

}  // namespace tiermem
