#include "common/malloc_tuning.hpp"

#include <malloc.h>

namespace tiermem {

void keep_freed_memory_for_reuse() {
  // Below 32 MiB (glibc's largest) from the heap, not a mapping of its own
  // unmapped on free; the heap's free top kept up to 128 MiB.
  (void)mallopt(M_MMAP_THRESHOLD, 32 << 20);
  (void)mallopt(M_TRIM_THRESHOLD, 128 << 20);
}

}  // namespace tiermem
