// A set of free unit ranges [start, start+count): the bookkeeping behind both
// the frame allocators (units = frames of a tier) and the virtual page range of
// a node (units = virtual pages).
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <vector>

namespace tiermem {

struct UnitRange {
  uint64_t start = 0;
  uint64_t count = 0;
  friend bool operator==(const UnitRange&, const UnitRange&) = default;
};

// Not thread-safe. Adjacent ranges are merged on release.
class ExtentSet {
 public:
  ExtentSet() = default;
  // Starts with [start, start+count) free.
  ExtentSet(uint64_t start, uint64_t count);

  uint64_t free_units() const { return m_free_units; }
  size_t fragments() const { return m_ranges.size(); }
  uint64_t largest() const;

  // Contiguous `count` units from the smallest free range that holds them.
  bool take_best_fit(uint64_t count, UnitRange* out);
  // Contiguous `count` units from the first free range at or after `cursor`,
  // wrapping around to the beginning (next-fit): freed ranges come back into
  // use only after the rest has been used once.
  bool take_next_fit(uint64_t count, uint64_t cursor, UnitRange* out);
  // `count` units in as few pieces as possible (largest ranges first); takes
  // nothing and returns false when fewer than `count` are free.
  bool take_scattered(uint64_t count, std::vector<UnitRange>* out);

  // Returns a range taken earlier. A range that overlaps a free one (given
  // back twice) is refused: false, and the set is unchanged.
  [[nodiscard]] bool release(UnitRange range);

  // Removes a specific range that must be wholly free (used on recovery).
  bool reserve(UnitRange range);

 private:
  void take_from(std::map<uint64_t, uint64_t>::iterator it, uint64_t start, uint64_t count);

  std::map<uint64_t, uint64_t> m_ranges;  // start -> count
  uint64_t m_free_units = 0;
};

}  // namespace tiermem
