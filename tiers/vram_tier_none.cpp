// Built when CUDA is not: the VRAM tier is simply not available.
#include "tiers/tier_backend.hpp"

namespace tiermem {

Result<std::unique_ptr<TierBackend>> make_vram_tier(int, uint64_t, uint32_t) {
  return Status(ErrorCode::tier_unavailable,
                "this tiermemd was built without CUDA (rebuild with -Dcuda=enabled on a "
                "machine with the CUDA toolkit)");
}

}  // namespace tiermem
