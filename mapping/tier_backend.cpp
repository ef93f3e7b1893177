#include "mapping/tier_backend.hpp"

#include <vector>

namespace tiermem {

uint64_t domain_span_for(uint64_t capacity) {
  constexpr uint64_t k_unit = 2 << 20;
  return (capacity + k_unit - 1) / k_unit * k_unit;
}

bool TierBackend::contains(uint64_t offset, uint64_t length) const {
  const uint64_t span = domain_span();
  if (span == 0) return false;
  const uint64_t d = offset / span;
  if (d >= domains()) return false;
  const uint64_t in_domain = offset % span;
  const uint64_t bytes = domain_bytes(static_cast<uint32_t>(d));
  return in_domain <= bytes && length <= bytes - in_domain;
}

Status TierBackend::copy_from(const TierBackend& source, uint64_t source_offset, uint64_t offset,
                              size_t length) {
  if (std::byte* src = source.host_base()) return write(offset, src + source_offset, length);
  // Neither side addressable by the CPU as a whole: bounce through host memory.
  constexpr size_t k_chunk = 4 << 20;
  std::vector<std::byte> bounce(length < k_chunk ? length : k_chunk);
  for (size_t done = 0; done < length;) {
    const size_t n = length - done < bounce.size() ? length - done : bounce.size();
    Status s = source.read(source_offset + done, bounce.data(), n);
    if (!s.ok()) return s;
    s = write(offset + done, bounce.data(), n);
    if (!s.ok()) return s;
    done += n;
  }
  return Status();
}

}  // namespace tiermem
