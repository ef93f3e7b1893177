#include "mapping/extent_set.hpp"

#include <algorithm>
#include <cassert>
#include <iterator>

namespace tiermem {

ExtentSet::ExtentSet(uint64_t start, uint64_t count) {
  if (count > 0) {
    m_ranges.emplace(start, count);
    m_free_units = count;
  }
}

uint64_t ExtentSet::largest() const {
  uint64_t best = 0;
  for (const auto& [start, count] : m_ranges) best = std::max(best, count);
  return best;
}

// Removes [start, start+count) from the free range at `it`, which holds it.
void ExtentSet::take_from(std::map<uint64_t, uint64_t>::iterator it, uint64_t start,
                          uint64_t count) {
  const uint64_t range_start = it->first;
  const uint64_t range_end = it->first + it->second;
  assert(start >= range_start && start + count <= range_end);
  m_ranges.erase(it);
  if (start > range_start) m_ranges.emplace(range_start, start - range_start);
  if (start + count < range_end) m_ranges.emplace(start + count, range_end - start - count);
  m_free_units -= count;
}

bool ExtentSet::take_best_fit(uint64_t count, UnitRange* out) {
  if (count == 0) return false;
  auto best = m_ranges.end();
  for (auto it = m_ranges.begin(); it != m_ranges.end(); ++it) {
    if (it->second >= count && (best == m_ranges.end() || it->second < best->second)) {
      best = it;
      if (it->second == count) break;
    }
  }
  if (best == m_ranges.end()) return false;
  *out = {best->first, count};
  take_from(best, best->first, count);
  return true;
}

bool ExtentSet::take_next_fit(uint64_t count, uint64_t cursor, UnitRange* out) {
  if (count == 0 || m_ranges.empty()) return false;
  // A range starting before the cursor may still extend past it.
  auto first = m_ranges.upper_bound(cursor);
  if (first != m_ranges.begin()) {
    auto prev = std::prev(first);
    if (prev->first + prev->second > cursor) first = prev;
  }
  auto try_range = [&](auto it) {
    const uint64_t start = std::max(it->first, cursor);
    const uint64_t end = it->first + it->second;
    if (end - start < count) return false;
    *out = {start, count};
    take_from(it, start, count);
    return true;
  };
  for (auto it = first; it != m_ranges.end(); ++it) {
    if (try_range(it)) return true;
  }
  // Wrap around; the range that straddles the cursor is tried whole this time.
  cursor = 0;
  for (auto it = m_ranges.begin(); it != m_ranges.end(); ++it) {
    const bool last = it == first;
    if (try_range(it)) return true;
    if (last) break;
  }
  return false;
}

bool ExtentSet::take_scattered(uint64_t count, std::vector<UnitRange>* out) {
  if (count == 0 || count > m_free_units) return false;
  UnitRange whole;
  if (take_best_fit(count, &whole)) {
    out->push_back(whole);
    return true;
  }
  // Largest first keeps the piece count low.
  std::vector<std::pair<uint64_t, uint64_t>> by_size(m_ranges.begin(), m_ranges.end());
  std::sort(by_size.begin(), by_size.end(),
            [](const auto& a, const auto& b) { return a.second > b.second; });
  uint64_t remaining = count;
  for (const auto& [start, length] : by_size) {
    const uint64_t n = std::min(length, remaining);
    take_from(m_ranges.find(start), start, n);
    out->push_back({start, n});
    remaining -= n;
    if (remaining == 0) break;
  }
  std::sort(out->begin(), out->end(),
            [](const UnitRange& a, const UnitRange& b) { return a.start < b.start; });
  return true;
}

bool ExtentSet::release(UnitRange range) {
  if (range.count == 0) return true;
  if (range.start + range.count < range.start) return false;
  auto next = m_ranges.lower_bound(range.start);
  const bool overlaps_prev = next != m_ranges.begin() && std::prev(next)->first + std::prev(next)->second > range.start;
  const bool overlaps_next = next != m_ranges.end() && range.start + range.count > next->first;
  // Giving back something that is free already is refused, not merged:
  // the caller's bookkeeping is wrong, and the set stays as it was.
  if (overlaps_prev || overlaps_next) return false;
  uint64_t start = range.start;
  uint64_t count = range.count;
  if (next != m_ranges.begin()) {
    auto prev = std::prev(next);
    if (prev->first + prev->second == start) {
      start = prev->first;
      count += prev->second;
      m_ranges.erase(prev);
    }
  }
  if (next != m_ranges.end() && next->first == range.start + range.count) {
    count += next->second;
    m_ranges.erase(next);
  }
  m_ranges.emplace(start, count);
  m_free_units += range.count;
  return true;
}

bool ExtentSet::reserve(UnitRange range) {
  auto it = m_ranges.upper_bound(range.start);
  if (it == m_ranges.begin()) return false;
  --it;
  if (it->first + it->second < range.start + range.count) return false;
  take_from(it, range.start, range.count);
  return true;
}

}  // namespace tiermem
