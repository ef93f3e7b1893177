#include "executor/runtime/exchange/bucket_collective.hpp"

#include <atomic>
#include <chrono>
#include <cstring>

namespace tiermem::exec {

uint64_t BucketCollective::all_reduce_beside(float* data, int64_t count) {
  if (!m_status.ok() || count == 0) return 0;
  const auto started = std::chrono::steady_clock::now();
  // The step being run is the one after the last committed.
  const int64_t step = m_arenas.committed();
  if (step != m_step) {
    m_step = step;
    m_index = 0;
  }
  const uint64_t number = static_cast<uint64_t>(step) * m_buckets + m_index + 1;
  ++m_index;
  const size_t bytes = static_cast<size_t>(count) * 4;
  const auto grads_bytes = static_cast<uint64_t>(m_arenas.grads_bytes());
  const uint64_t offset = static_cast<uint64_t>(reinterpret_cast<std::byte*>(data) - m_arenas.grads().data());
  const uint64_t at = static_cast<uint64_t>(step % 2) * grads_bytes + offset;
  std::memcpy(m_arenas.publish().data() + at, data, bytes);
  std::atomic_ref<uint64_t>(m_arenas.ctl()[k_buckets]).store(number, std::memory_order_release);
  m_part.resize(static_cast<size_t>(count));
  std::vector<float> sum(static_cast<size_t>(count), 0.0f);
  for (int r : m_group.ranks) {
    const float* src = reinterpret_cast<const float*>(m_arenas.publish().data() + at);
    if (r != m_group.ranks[static_cast<size_t>(m_group.me)]) {
      Status s = m_dir.wait_at_least(m_peers.ctl_word(r, k_buckets), number,
                                     "rank " + std::to_string(r) + "'s gradient bucket " + std::to_string(number));
      auto publish = s.ok() ? m_dir.peer(r, "publish") : Result<Gva>(s);
      if (publish.ok()) s = m_dir.read(publish->plus(at), m_part.data(), bytes);
      if (!s.ok() || !publish.ok()) {
        m_status = s.ok() ? publish.status() : s;
        return 0;
      }
      src = m_part.data();
    }
    for (int64_t i = 0; i < count; ++i) sum[static_cast<size_t>(i)] += src[i];
  }
  std::memcpy(data, sum.data(), bytes);
  m_bytes += bytes;
  m_seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
  return 0;
}

}  // namespace tiermem::exec
