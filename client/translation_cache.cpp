#include "client/translation_cache.hpp"

#include <iterator>
#include <mutex>

namespace tiermem::detail {

std::shared_ptr<const CachedAllocation> TranslationCache::find(Gva gva) const {
  std::shared_lock lock(m_mutex);
  auto it = m_entries.upper_bound({gva.node, gva.offset});
  if (it == m_entries.begin()) return nullptr;
  const auto& a = std::prev(it)->second;
  const uint64_t span = a->slot_bytes != 0 ? a->size : a->page_versions.size() * m_page_size;
  const bool inside = a->base.node == gva.node && gva.offset < a->base.offset + span;
  if (!inside || (gva.generation != 0 && gva.generation != a->base.generation)) return nullptr;
  return a;
}

void TranslationCache::put(std::shared_ptr<const CachedAllocation> a) {
  const Key key{a->base.node, a->base.offset};
  std::unique_lock lock(m_mutex);
  m_entries[key] = std::move(a);
}

void TranslationCache::replace(const std::shared_ptr<const CachedAllocation>& old,
                               std::shared_ptr<const CachedAllocation> with) {
  std::unique_lock lock(m_mutex);
  auto it = m_entries.find({old->base.node, old->base.offset});
  if (it != m_entries.end() && it->second == old) it->second = std::move(with);
}

void TranslationCache::forget(Gva gva) {
  std::unique_lock lock(m_mutex);
  auto it = m_entries.upper_bound({gva.node, gva.offset});
  if (it != m_entries.begin() && std::prev(it)->first.first == gva.node) m_entries.erase(std::prev(it));
}

void TranslationCache::forget_node(NodeId node) {
  std::unique_lock lock(m_mutex);
  for (auto it = m_entries.begin(); it != m_entries.end();) {
    it = it->first.first == node ? m_entries.erase(it) : std::next(it);
  }
}

}  // namespace tiermem::detail
