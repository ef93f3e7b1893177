#include "access/remote_memory.hpp"

#include <algorithm>

#include <tiermem/status_macros.h>

namespace tiermem {
namespace {

Status unreachable(NodeId node, const std::string& what) {
  return Status(ErrorCode::not_supported, "node " + std::to_string(node) + "'s " + what +
                                              " cannot be reached one-sided");
}

}  // namespace

Result<std::shared_ptr<RemoteNode>> connect_remote_node(Transport& transport, NodeId node,
                                                        uint64_t incarnation,
                                                        const std::string& address,
                                                        const std::vector<RegionAdvert>& regions) {
  auto ep = transport.connect(address);
  if (!ep.ok()) return ep.status().with_context("node " + std::to_string(node));
  auto remote = std::make_shared<RemoteNode>();
  remote->node = node;
  remote->incarnation = incarnation;
  remote->endpoint = *ep;
  for (const RegionAdvert& r : regions) {
    RemoteRegion region{r.base, r.length, r.persistent, nullptr};
    if (!r.packed_key.empty()) {
      auto key = transport.unpack(*ep, r.packed_key, r.base);
      if (!key.ok()) return key.status().with_context("node " + std::to_string(node));
      region.key = *key;
    }
    if (r.versions) {
      remote->versions = std::move(region);
    } else {
      remote->tiers[static_cast<size_t>(r.tier)] = std::move(region);
    }
  }
  return remote;
}

// --- version words -------------------------------------------------------------

Status RemoteVersionWords::check(uint64_t first, size_t count) const {
  if (!m_node->versions.key) return unreachable(m_node->node, "version words");
  if ((first + count) * sizeof(uint64_t) > m_node->versions.length) {
    return Status(ErrorCode::out_of_range, "version word beyond node " + std::to_string(m_node->node) + "'s array");
  }
  return Status();
}

Status RemoteVersionWords::load(uint64_t first, size_t count, uint64_t* out) {
  TIERMEM_RETURN_IF_ERROR(check(first, count));
  auto batch = m_transport.batch();
  Status s = m_transport.get(*batch, *m_node->endpoint, out, count * sizeof(uint64_t),
                             m_node->versions.base + first * sizeof(uint64_t), *m_node->versions.key);
  if (!s.ok()) return s;
  return m_transport.wait(*batch, m_timeout);
}

Status RemoteVersionWords::compare_swap(uint64_t page, uint64_t expected, uint64_t desired, uint64_t* old) {
  TIERMEM_RETURN_IF_ERROR(check(page, 1));
  auto batch = m_transport.batch();
  Status s = m_transport.atomic(*batch, *m_node->endpoint, AtomicOp::compare_swap, desired, expected,
                                m_node->versions.base + page * sizeof(uint64_t), *m_node->versions.key, old);
  if (!s.ok()) return s;
  return m_transport.wait(*batch, m_timeout);
}

Status RemoteVersionWords::release(std::span<const uint64_t> pages) {
  if (pages.empty()) return Status();
  auto batch = m_transport.batch();
  std::vector<uint64_t> olds(pages.size());
  for (size_t i = 0; i < pages.size(); ++i) {
    TIERMEM_RETURN_IF_ERROR(check(pages[i], 1));
    Status s = m_transport.atomic(*batch, *m_node->endpoint, AtomicOp::fetch_add, 1, 0,
                                  m_node->versions.base + pages[i] * sizeof(uint64_t),
                                  *m_node->versions.key, &olds[i]);
    if (!s.ok()) return s;
  }
  return m_transport.wait(*batch, m_timeout);
}

Status RemoteVersionWords::snapshot(uint64_t first, size_t count, std::span<const CopySegment> segments,
                                    uint64_t* before, uint64_t* after) {
  std::vector<RemoteFrameData*> frames;
  for (const CopySegment& seg : segments) {
    auto* f = dynamic_cast<RemoteFrameData*>(seg.frames);
    if (f == nullptr || f->node().endpoint != m_node->endpoint) {
      return Status(ErrorCode::not_supported, "segments on other nodes");
    }
    frames.push_back(f);
  }
  TIERMEM_RETURN_IF_ERROR(check(first, count));
  const uint64_t addr = m_node->versions.base + first * sizeof(uint64_t);
  auto batch = m_transport.batch();
  Status s = m_transport.get(*batch, *m_node->endpoint, before, count * sizeof(uint64_t), addr, *m_node->versions.key);
  if (s.ok()) s = m_transport.fence(*batch, m_timeout);
  for (size_t i = 0; i < segments.size() && s.ok(); ++i) {
    s = frames[i]->issue_read(*batch, segments[i].frame_offset, segments[i].buffer, segments[i].length);
  }
  if (s.ok()) s = m_transport.fence(*batch, m_timeout);
  if (s.ok()) {
    s = m_transport.get(*batch, *m_node->endpoint, after, count * sizeof(uint64_t), addr, *m_node->versions.key);
  }
  Status w = m_transport.wait(*batch, m_timeout);
  return s.ok() ? w : s;
}

// --- frames ------------------------------------------------------------------------

bool RemoteFrameData::persistent() const { return m_node->tiers[static_cast<size_t>(m_tier)].persistent; }

Status RemoteFrameData::check(uint64_t frame_offset, size_t length) const {
  const RemoteRegion& r = m_node->tiers[static_cast<size_t>(m_tier)];
  if (!r.key) return unreachable(m_node->node, std::string(tier_name(m_tier)) + " tier");
  if (frame_offset + length > r.length) return stale_translation();
  return Status();
}

Status RemoteFrameData::issue_read(Batch& batch, uint64_t frame_offset, void* dst, size_t length) {
  TIERMEM_RETURN_IF_ERROR(check(frame_offset, length));
  const RemoteRegion& r = m_node->tiers[static_cast<size_t>(m_tier)];
  auto* out = static_cast<std::byte*>(dst);
  for (size_t done = 0; done < length; done += k_remote_chunk) {
    const size_t n = std::min(k_remote_chunk, length - done);
    Status s = m_transport.get(batch, *m_node->endpoint, out + done, n, r.base + frame_offset + done, *r.key);
    if (!s.ok()) return s;
  }
  return Status();
}

Status RemoteFrameData::read(uint64_t frame_offset, void* dst, size_t length) {
  auto batch = m_transport.batch();
  Status s = issue_read(*batch, frame_offset, dst, length);
  Status w = m_transport.wait(*batch, m_timeout);
  return s.ok() ? w : s;
}

Status RemoteFrameData::write(uint64_t frame_offset, const void* src, size_t length) {
  TIERMEM_RETURN_IF_ERROR(check(frame_offset, length));
  const RemoteRegion& r = m_node->tiers[static_cast<size_t>(m_tier)];
  auto batch = m_transport.batch();
  const auto* in = static_cast<const std::byte*>(src);
  for (size_t done = 0; done < length; done += k_remote_chunk) {
    const size_t n = std::min(k_remote_chunk, length - done);
    Status s = m_transport.put(*batch, *m_node->endpoint, in + done, n, r.base + frame_offset + done, *r.key);
    if (!s.ok()) {
      (void)m_transport.wait(*batch, m_timeout);
      return s;
    }
  }
  TIERMEM_RETURN_IF_ERROR(m_transport.wait(*batch, m_timeout));
  // Completion of a put is local; the flush makes the bytes visible at the
  // target before the caller releases the page lock.
  TIERMEM_RETURN_IF_ERROR(m_transport.flush(*m_node->endpoint, m_timeout));
  if (r.persistent && m_persist) return m_persist(m_tier, frame_offset, length);
  return Status();
}

Status RemoteFrameData::atomic(uint64_t frame_offset, WordOp op, uint64_t operand, uint64_t compare,
                               uint64_t* old) {
  if (frame_offset % 8 != 0) return Status(ErrorCode::invalid_argument, "atomic on an unaligned word");
  TIERMEM_RETURN_IF_ERROR(check(frame_offset, 8));
  const RemoteRegion& r = m_node->tiers[static_cast<size_t>(m_tier)];
  auto batch = m_transport.batch();
  Status s = m_transport.atomic(*batch, *m_node->endpoint,
                                op == WordOp::fetch_add ? AtomicOp::fetch_add : AtomicOp::compare_swap,
                                operand, compare, r.base + frame_offset, *r.key, old);
  if (!s.ok()) return s;
  s = m_transport.wait(*batch, m_timeout);
  if (s.ok() && r.persistent && m_persist) return m_persist(m_tier, frame_offset, 8);
  return s;
}

}  // namespace tiermem
