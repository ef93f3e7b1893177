// Arenas: the snapshot of the committed state (--snapshot-every, --replicas)
// and a replacement's resume from it (see arenas.hpp for the slot's layout).
#include <xxhash.h>

#include <algorithm>
#include <atomic>
#include <cinttypes>
#include <cstdio>
#include <cstring>

#include <tiermem/status_macros.h>

#include "executor/runtime/state/arenas.hpp"

namespace tiermem::exec {
namespace {

constexpr size_t k_header_words = 6;
// The format before (four ordered writes, no checksum): recognised only to
// refuse it by name.
constexpr uint64_t k_snapshot_magic_v1 = 0x31305041'4e534d54;  // "TMSNAP01"

// XXH3 (64 bits) of everything in the slot after its header: at memory
// speed (zlib's CRC-32 took a third of a small model's step).
uint64_t checksum(const std::vector<std::byte>& slot) {
  return XXH3_64bits(slot.data() + k_snapshot_header, slot.size() - static_cast<size_t>(k_snapshot_header));
}

}  // namespace

int64_t Arenas::snapshot_slot_bytes() const {
  return (k_snapshot_header + m_params_bytes + m_optimizer_bytes + m_published_bytes + 63) / 64 * 64;
}

void Arenas::stage_snapshot(int64_t committed, Compute& compute, SnapshotImage* image) const {
  // Slot (committed / every) % 2 (the other one holds the snapshot before):
  // the committed parameters and optimizer state, and with --replicas the
  // gradients published for the step before, then the header over them.
  const int64_t parity = committed % 2;
  image->at = m_snapshot.gva.plus(
      static_cast<uint64_t>(((committed / std::max<int64_t>(m_snapshot_every, 1)) % 2) * snapshot_slot_bytes()));
  image->step = committed;
  image->bytes.resize(static_cast<size_t>(snapshot_slot_bytes()));
  std::byte* out = image->bytes.data() + k_snapshot_header;
  compute.copy(out, m_params.data() + parity * m_params_bytes, static_cast<size_t>(m_params_bytes));
  out += m_params_bytes;
  compute.copy(out, m_optimizer.data() + parity * m_optimizer_bytes, static_cast<size_t>(m_optimizer_bytes));
  out += m_optimizer_bytes;
  if (m_published_bytes > 0) {
    if (committed > 0) {
      std::memcpy(out, m_publish.data() + ((committed - 1) % 2) * m_published_bytes,
                  static_cast<size_t>(m_published_bytes));
    } else {
      std::memset(out, 0, static_cast<size_t>(m_published_bytes));
    }
  }
  const uint64_t header[k_header_words] = {k_snapshot_magic,
                                           static_cast<uint64_t>(committed),
                                           static_cast<uint64_t>(m_params_bytes),
                                           static_cast<uint64_t>(m_optimizer_bytes),
                                           static_cast<uint64_t>(m_published_bytes),
                                           checksum(image->bytes)};
  std::memcpy(image->bytes.data(), header, sizeof header);
}

Status Arenas::snapshot(JobDirectory& dir, int64_t committed, Compute& compute) const {
  SnapshotImage image;
  stage_snapshot(committed, compute, &image);
  Status s = dir.write(image.at, image.bytes.data(), image.bytes.size());
  return s.ok() ? s : s.with_context("snapshot of step " + std::to_string(committed));
}

std::vector<std::pair<Gva, int64_t>> Arenas::snapshots(JobDirectory& dir, const std::vector<Gva>& candidates,
                                                       int* older) const {
  std::vector<std::pair<Gva, int64_t>> out;
  for (const Gva& g : candidates) {
    for (int64_t slot = 0; slot < 2; ++slot) {
      const Gva at = g.plus(static_cast<uint64_t>(slot * snapshot_slot_bytes()));
      uint64_t header[k_header_words] = {};
      Status s = dir.read(at, header, sizeof header);
      if (!s.ok()) {
        std::fprintf(stderr, "rank snapshot %s unreadable: %s\n", at.to_string().c_str(), s.to_string().c_str());
        continue;
      }
      if (header[0] == k_snapshot_magic_v1 && header[1] != 0) ++*older;
      if (header[0] != k_snapshot_magic || header[1] == 0 || header[2] != static_cast<uint64_t>(m_params_bytes) ||
          header[3] != static_cast<uint64_t>(m_optimizer_bytes) || header[4] != static_cast<uint64_t>(m_published_bytes)) {
        continue;
      }
      out.emplace_back(at, static_cast<int64_t>(header[1]));
    }
  }
  std::stable_sort(out.begin(), out.end(), [](const auto& a, const auto& b) { return a.second > b.second; });
  return out;
}

Status Arenas::restore(JobDirectory& dir, Gva slot, int64_t step, Compute& compute) {
  SnapshotImage image;
  image.bytes.resize(static_cast<size_t>(snapshot_slot_bytes()));
  TIERMEM_RETURN_IF_ERROR(dir.read(slot, image.bytes.data(), image.bytes.size()));
  uint64_t header[k_header_words];
  std::memcpy(header, image.bytes.data(), sizeof header);
  if (header[0] != k_snapshot_magic || header[1] != static_cast<uint64_t>(step) || header[5] != checksum(image.bytes)) {
    return Status(ErrorCode::data_lost, "the snapshot of step " + std::to_string(step) + " at " + slot.to_string() +
                                            " fails its checksum: its writer died while writing it");
  }
  const int64_t parity = step % 2;
  const std::byte* in = image.bytes.data() + k_snapshot_header;
  compute.copy(m_params.data() + parity * m_params_bytes, in, static_cast<size_t>(m_params_bytes));
  in += m_params_bytes;
  compute.copy(m_optimizer.data() + parity * m_optimizer_bytes, in, static_cast<size_t>(m_optimizer_bytes));
  in += m_optimizer_bytes;
  if (m_published_bytes > 0 && step > 0) {
    // The gradients this rank published for step - 1: a rank still reading
    // them when the old rank died reads them here now.
    std::memcpy(m_publish.data() + ((step - 1) % 2) * m_published_bytes, in, static_cast<size_t>(m_published_bytes));
  }
  TIERMEM_RETURN_IF_ERROR(compute.sync());
  // Where a rank that finished `step` stands: committed, past the barrier,
  // its gradients of the step before published (the other ranks have read
  // them, or read them again from this rank's new arena).
  for (const CtlWord w : {k_committed, k_barrier, k_published}) {
    std::atomic_ref<uint64_t>(ctl()[w]).store(static_cast<uint64_t>(step));
  }
  m_resumed = true;
  m_restored_from = slot;
  return Status();
}

Status Arenas::resume_elsewhere(JobDirectory& dir, Compute& compute) {
  // New on this node: a first start, or the replacement of a rank whose node
  // died. Its snapshot elsewhere (a copy, if its home died with the rank)
  // says which: the newest whole one.
  int older = 0;
  const auto found = snapshots(dir, dir.elsewhere("snapshot", m_snapshot.gva), &older);
  for (const auto& [slot, step] : found) {
    Status s = restore(dir, slot, step, compute);
    if (s.ok()) return snapshot(dir, step, compute);  // our own snapshot holds it before we go on
    std::fprintf(stderr, "rank snapshot of step %" PRId64 " not taken: %s\n", step, s.to_string().c_str());
  }
  if (found.empty() && older > 0) {
    // Starting the rank from step 0 while the others are far on would
    // diverge the job: refused.
    return Status(ErrorCode::failed_precondition,
                  "this rank's snapshots elsewhere are of an older format (TMSNAP01, before the checksummed "
                  "one-write slots): this tiermem-exec cannot resume from them; train the job again (--restart)");
  }
  if (found.empty()) return Status();
  return Status(ErrorCode::data_lost, "every snapshot of this rank elsewhere (" + std::to_string(found.size()) +
                                          " slots) is torn or unreadable: it cannot resume where it stopped");
}

}  // namespace tiermem::exec
