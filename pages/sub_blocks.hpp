// L3 of the page table (M3): per page, which sub-blocks ("cache-line groups",
// page_size / 64 bytes each) have ever been written (valid) and since the last
// persist or migration (dirty). Two words per page in a flat array that lives
// in shared memory, so co-located clients writing directly set the bits too.
#pragma once

#include <cstddef>
#include <cstdint>

namespace tiermem {

inline constexpr unsigned k_sub_blocks_per_page = 64;

// Word layout of the L3 array: page p has valid at [2p], dirty at [2p+1].
inline constexpr size_t k_l3_words_per_page = 2;

// Sets the L3 bits for a write of [offset, offset+length) within a page, given
// the page's two words: valid always, dirty unless the write was already made
// durable (PMEM). Shared by the daemon and the client's direct path.
void mark_sub_blocks(uint64_t* words, uint64_t page_size, uint64_t offset, uint64_t length,
                     bool dirty);

}  // namespace tiermem
