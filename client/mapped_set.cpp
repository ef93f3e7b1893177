#include "client/mapped_set.hpp"

#include <sys/mman.h>

#include <utility>

namespace tiermem::detail {

std::shared_ptr<ClientCore> MappedSet::core() const {
  std::lock_guard lock(m_mutex);
  return m_core;
}

void MappedSet::set_core(std::shared_ptr<ClientCore> core) {
  std::lock_guard lock(m_mutex);
  m_core = std::move(core);
}

uint64_t MappedSet::add(Entry entry) {
  std::lock_guard lock(m_mutex);
  const uint64_t id = m_next_id++;
  m_entries.emplace(id, std::move(entry));
  return id;
}

bool MappedSet::remove(uint64_t id) {
  std::lock_guard lock(m_mutex);
  auto it = m_entries.find(id);
  if (it == m_entries.end()) return false;
  const Entry& e = it->second;
  // A revoked range is an anonymous PROT_NONE mapping of the same extent.
  if (e.base != nullptr) ::munmap(e.base, e.length);
  const bool pinned = e.revoked.ok();
  m_entries.erase(it);
  return pinned;
}

bool MappedSet::contains(uint64_t id) const {
  std::lock_guard lock(m_mutex);
  return m_entries.count(id) != 0;
}

Status MappedSet::status(uint64_t id) const {
  std::lock_guard lock(m_mutex);
  auto it = m_entries.find(id);
  return it == m_entries.end() ? Status(ErrorCode::failed_precondition, "the mapping was released") : it->second.revoked;
}

std::map<uint64_t, MappedSet::Entry> MappedSet::live() const {
  std::lock_guard lock(m_mutex);
  std::map<uint64_t, Entry> out;
  for (const auto& [id, e] : m_entries) {
    if (e.revoked.ok()) out.emplace(id, e);
  }
  return out;
}

void MappedSet::revoke_locked(Entry& e, const Status& why) {
  if (!e.revoked.ok()) return;
  if (e.base != nullptr) {
    // In place, in one call: no instant at which the range is unmapped (and
    // could be handed to another mapping of this process).
    void* p = ::mmap(e.base, e.length, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_FIXED, -1, 0);
    // Out of mappings (ENOMEM): the range stays the file's, but no access
    // through it goes through any more.
    if (p == MAP_FAILED) (void)::mprotect(e.base, e.length, PROT_NONE);
  }
  e.revoked = why;
  m_pending.emplace_back(e.allocation.gva, why);
}

void MappedSet::revoke(uint64_t id, const Status& why) {
  std::lock_guard lock(m_mutex);
  if (auto it = m_entries.find(id); it != m_entries.end()) revoke_locked(it->second, why);
}

void MappedSet::revoke_if(const std::function<bool(const Entry&)>& which, const Status& why) {
  std::lock_guard lock(m_mutex);
  for (auto& [id, e] : m_entries) {
    if (e.revoked.ok() && which(e)) revoke_locked(e, why);
  }
}

void MappedSet::deliver() {
  std::vector<std::pair<Gva, Status>> pending;
  {
    std::lock_guard lock(m_mutex);
    pending.swap(m_pending);
  }
  if (!m_on_revoked) return;
  for (const auto& [gva, why] : pending) m_on_revoked(gva, why);
}

}  // namespace tiermem::detail
