#include "access/remote_memory.hpp"

#include <algorithm>

#include <tiermem/status_macros.h>

#include "common/deadline.hpp"
#include "pages/version.hpp"

namespace tiermem {
namespace {

Status unreachable(NodeId node, const std::string& what) {
  return Status(ErrorCode::not_supported, "node " + std::to_string(node) + "'s " + what +
                                              " cannot be reached one-sided");
}

}  // namespace

const RemoteRegion* RemoteNode::version_region(uint64_t page, uint64_t count) const {
  if (pages_per_domain == 0) return nullptr;
  auto it = versions.find(static_cast<uint32_t>(page / pages_per_domain));
  if (it == versions.end() || page < it->second.first) return nullptr;
  const uint64_t words = it->second.length / sizeof(uint64_t);
  return page - it->second.first <= words && count <= words - (page - it->second.first) ? &it->second : nullptr;
}

const RemoteRegion* RemoteNode::frame_region(Tier tier, uint64_t offset, uint64_t length) const {
  const auto t = static_cast<size_t>(tier);
  if (t >= tiers.size() || domain_span[t] == 0) return nullptr;
  auto it = tiers[t].find(static_cast<uint32_t>(offset / domain_span[t]));
  if (it == tiers[t].end() || offset < it->second.first) return nullptr;
  const uint64_t in = offset - it->second.first;
  return in <= it->second.length && length <= it->second.length - in ? &it->second : nullptr;
}

namespace {

Reach reach_of(const Transport& transport, const RemoteRegion* r) {
  if (r == nullptr || !r->key) return Reach::stale;
  return transport.one_sided(*r->key) ? Reach::one_sided : Reach::message;
}

}  // namespace

Reach RemoteNode::reach_words(const Transport& transport, uint64_t page, uint64_t count) const {
  return reach_of(transport, version_region(page, count));
}

Reach RemoteNode::reach_frames(const Transport& transport, Tier tier, uint64_t offset, uint64_t length) const {
  // VRAM is registered (where the transport can) as one region of no tenant:
  // a client never holds its key, and asking the node again gives none.
  if (tier == Tier::vram && tiers[static_cast<size_t>(Tier::vram)].empty()) return Reach::none;
  return reach_of(transport, frame_region(tier, offset, length));
}

namespace {

Status add_region(Transport& transport, RemoteNode* remote, const RegionAdvert& r) {
  RemoteRegion region{r.first, r.base, r.length, r.persistent, r.memory_generation, nullptr};
  if (!r.packed_key.empty()) {
    TIERMEM_ASSIGN_OR_RETURN(region.key, transport.unpack(remote->endpoint, r.packed_key, r.base));
  }
  if (r.versions) {
    remote->versions[r.domain] = std::move(region);
    return Status();
  }
  const auto t = static_cast<size_t>(r.tier);
  if (r.tier == Tier::automatic || t >= remote->tiers.size()) {
    return Status(ErrorCode::malformed_frame, "node " + std::to_string(remote->node) + " advertised a region of no tier");
  }
  // Domain d of a tier starts at frame offset d * span.
  if (r.domain > 0 && r.first % r.domain == 0) remote->domain_span[t] = r.first / r.domain;
  if (remote->domain_span[t] == 0 && r.domain == 0) remote->domain_span[t] = r.length;
  remote->tiers[t][r.domain] = std::move(region);
  return Status();
}

}  // namespace

Result<std::shared_ptr<RemoteNode>> connect_remote_node(Transport& transport, const NodeAdvert& advert) {
  TIERMEM_ASSIGN_OR_RETURN(auto ep, transport.connect(advert.transport_address));
  auto remote = std::make_shared<RemoteNode>();
  remote->node = advert.node;
  remote->incarnation = advert.incarnation;
  remote->pages_per_domain = advert.pages_per_domain;
  remote->regions_version = advert.regions_version;
  remote->endpoint = ep;
  for (const RegionAdvert& r : advert.regions) {
    if (Status s = add_region(transport, remote.get(), r); !s.ok()) return s.with_context("node " + std::to_string(advert.node));
  }
  return remote;
}

Result<std::shared_ptr<RemoteNode>> with_regions(Transport& transport, const RemoteNode& node,
                                                 const std::vector<RegionAdvert>& regions) {
  auto remote = std::make_shared<RemoteNode>(node);
  for (const RegionAdvert& r : regions) {
    if (Status s = add_region(transport, remote.get(), r); !s.ok()) return s.with_context("node " + std::to_string(node.node));
  }
  return remote;
}

// --- version words -------------------------------------------------------------

Result<const RemoteRegion*> RemoteVersionWords::region(uint64_t first, size_t count) const {
  const RemoteRegion* r = m_node->version_region(first, count);
  if (r == nullptr || !r->key) return unreachable(m_node->node, "version words of page " + std::to_string(first));
  return r;
}

uint64_t RemoteVersionWords::address(const RemoteRegion& r, uint64_t page) {
  return r.base + (page - r.first) * sizeof(uint64_t);
}

Status RemoteVersionWords::load(uint64_t first, size_t count, uint64_t* out) {
  TIERMEM_ASSIGN_OR_RETURN(const RemoteRegion* r, region(first, count));
  auto batch = m_transport.batch();
  TIERMEM_RETURN_IF_ERROR(
      m_transport.get(*batch, *m_node->endpoint, out, count * sizeof(uint64_t), address(*r, first), *r->key));
  return m_transport.wait(*batch, ScopedDeadline::bound(m_timeout));
}

Status RemoteVersionWords::compare_swap(uint64_t page, uint64_t expected, uint64_t desired, uint64_t* old) {
  TIERMEM_ASSIGN_OR_RETURN(const RemoteRegion* r, region(page, 1));
  auto batch = m_transport.batch();
  TIERMEM_RETURN_IF_ERROR(m_transport.atomic(*batch, *m_node->endpoint, AtomicOp::compare_swap, desired, expected,
                                             address(*r, page), *r->key, old));
  return m_transport.wait(*batch, ScopedDeadline::bound(m_timeout));
}

Status RemoteVersionWords::release(std::span<const uint64_t> pages) {
  if (pages.empty()) return Status();
  auto batch = m_transport.batch();
  std::vector<uint64_t> olds(pages.size());
  for (size_t i = 0; i < pages.size(); ++i) {
    TIERMEM_ASSIGN_OR_RETURN(const RemoteRegion* r, region(pages[i], 1));
    TIERMEM_RETURN_IF_ERROR(m_transport.atomic(*batch, *m_node->endpoint, AtomicOp::fetch_add, 1, 0,
                                               address(*r, pages[i]), *r->key, &olds[i]));
  }
  return m_transport.wait(*batch, ScopedDeadline::bound(m_timeout));
}

Status RemoteVersionWords::compare_swap_all(uint64_t first, size_t count, const uint64_t* expected, uint64_t* old) {
  if (count == 0) return Status();
  TIERMEM_ASSIGN_OR_RETURN(const RemoteRegion* r, region(first, count));
  auto batch = m_transport.batch();
  for (size_t i = 0; i < count; ++i) {
    TIERMEM_RETURN_IF_ERROR(m_transport.atomic(*batch, *m_node->endpoint, AtomicOp::compare_swap, expected[i] + 1,
                                               expected[i], address(*r, first + i), *r->key, &old[i]));
  }
  return m_transport.wait(*batch, ScopedDeadline::bound(m_timeout));
}

bool RemoteVersionWords::same_node(std::span<const CopySegment> segments, std::vector<RemoteFrameData*>* frames) const {
  for (const CopySegment& seg : segments) {
    auto* f = dynamic_cast<RemoteFrameData*>(seg.frames);
    if (f == nullptr || f->node().endpoint != m_node->endpoint) return false;
    frames->push_back(f);
  }
  return true;
}

Status RemoteVersionWords::snapshot(uint64_t first, size_t count, std::span<const CopySegment> segments,
                                    uint64_t* before, uint64_t* after) {
  std::vector<RemoteFrameData*> frames;
  if (!same_node(segments, &frames)) return Status(ErrorCode::not_supported, "segments on other nodes");
  TIERMEM_ASSIGN_OR_RETURN(const RemoteRegion* r, region(first, count));
  const uint64_t addr = address(*r, first);
  auto batch = m_transport.batch();
  Status s = m_transport.get(*batch, *m_node->endpoint, before, count * sizeof(uint64_t), addr, *r->key);
  if (s.ok()) s = m_transport.fence(*batch, ScopedDeadline::bound(m_timeout));
  for (size_t i = 0; i < segments.size() && s.ok(); ++i) {
    s = frames[i]->issue_read(*batch, segments[i].frame_offset, segments[i].buffer, segments[i].length);
  }
  if (s.ok()) s = m_transport.fence(*batch, ScopedDeadline::bound(m_timeout));
  if (s.ok()) s = m_transport.get(*batch, *m_node->endpoint, after, count * sizeof(uint64_t), addr, *r->key);
  Status w = m_transport.wait(*batch, ScopedDeadline::bound(m_timeout));
  return s.ok() ? w : s;
}

namespace {

// Locks a page only while unlocked, not wanted exclusively (migration, free)
// and of the epoch the caller translated with; undone by a release.
constexpr uint64_t k_epoch_bits = ~version::k_sequence_mask;
WordCondition writable_at(uint64_t cached) {
  return {k_epoch_bits | version::k_exclusive_pending | 1, cached & k_epoch_bits};
}

}  // namespace

Status RemoteVersionWords::issue_snapshot(TransportBatch& batch, uint64_t first, size_t count,
                                          std::span<const CopySegment> segments, uint64_t* before, uint64_t* after) {
  std::vector<RemoteFrameData*> frames;
  if (!same_node(segments, &frames)) return Status(ErrorCode::not_supported, "segments on other nodes");
  TIERMEM_ASSIGN_OR_RETURN(const RemoteRegion* r, region(first, count));
  if (m_transport.one_sided(*r->key)) return Status(ErrorCode::not_supported, "one-sided words");
  size_t bytes = 2 * count * sizeof(uint64_t);
  for (size_t i = 0; i < segments.size(); ++i) {
    if (!frames[i]->messages(segments[i].frame_offset, segments[i].length)) {
      return Status(ErrorCode::not_supported, "one-sided frames");
    }
    bytes += segments[i].length;
  }
  if (bytes > k_message_max_bytes) return Status(ErrorCode::not_supported, "too large for one message");
  Endpoint& ep = *m_node->endpoint;
  TIERMEM_RETURN_IF_ERROR(m_transport.reserve(batch, ep, 2 + segments.size(), 0, bytes));
  const uint64_t addr = address(*r, first);
  TIERMEM_RETURN_IF_ERROR(m_transport.get(batch, ep, before, count * sizeof(uint64_t), addr, *r->key));
  for (size_t i = 0; i < segments.size(); ++i) {
    TIERMEM_RETURN_IF_ERROR(
        frames[i]->issue_read(batch, segments[i].frame_offset, segments[i].buffer, segments[i].length));
  }
  return m_transport.get(batch, ep, after, count * sizeof(uint64_t), addr, *r->key);
}

Status RemoteVersionWords::issue_locked_copy(TransportBatch& batch, const PageRange& range,
                                             std::span<const CopySegment> segments, bool to_memory, uint64_t* olds,
                                             uint64_t* releases, uint64_t* stopped) {
  std::vector<RemoteFrameData*> frames;
  if (!same_node(segments, &frames)) return Status(ErrorCode::not_supported, "segments on other nodes");
  TIERMEM_ASSIGN_OR_RETURN(const RemoteRegion* r, region(range.first_page, range.count));
  if (m_transport.one_sided(*r->key)) return Status(ErrorCode::not_supported, "one-sided words");
  size_t bytes = 0;
  size_t ops = 2 * range.count + 1;
  for (size_t i = 0; i < segments.size(); ++i) {
    if (!frames[i]->messages(segments[i].frame_offset, segments[i].length)) {
      return Status(ErrorCode::not_supported, "one-sided frames");
    }
    bytes += segments[i].length;
    ops += 2;  // the put (or get), and a persist
  }
  // It must travel as one message to be one request.
  if (bytes > k_message_max_bytes || ops > k_message_max_ops) {
    return Status(ErrorCode::not_supported, "too large for one message");
  }
  Endpoint& ep = *m_node->endpoint;
  TIERMEM_RETURN_IF_ERROR(m_transport.reserve(batch, ep, ops, to_memory ? bytes : 0, to_memory ? 0 : bytes));
  for (uint64_t i = 0; i < range.count; ++i) {
    const WordCondition c = writable_at(range.cached[i]);
    olds[i] = c.value;  // meets the condition: only a word seen stopping the group does not
    TIERMEM_RETURN_IF_ERROR(
        m_transport.add_if(batch, ep, c, 1, 1, address(*r, range.first_page + i), *r->key, &olds[i]));
  }
  for (size_t i = 0; i < segments.size(); ++i) {
    TIERMEM_RETURN_IF_ERROR(
        to_memory ? frames[i]->issue_write(batch, segments[i].frame_offset, segments[i].buffer, segments[i].length)
                  : frames[i]->issue_read(batch, segments[i].frame_offset, segments[i].buffer, segments[i].length));
  }
  for (uint64_t i = 0; i < range.count; ++i) {
    TIERMEM_RETURN_IF_ERROR(m_transport.atomic(batch, ep, AtomicOp::fetch_add, 1, 0,
                                               address(*r, range.first_page + i), *r->key, &releases[i]));
  }
  return m_transport.end_group(batch, ep, stopped);
}

Status RemoteVersionWords::locked_copy(const PageRange& range, std::span<const CopySegment> segments, bool to_memory,
                                       uint64_t* blocked, uint64_t* seen) {
  std::vector<uint64_t> olds(range.count);
  std::vector<uint64_t> released(range.count);
  uint64_t stopped = 0;
  auto batch = m_transport.batch();
  // Nothing was sent yet (a message goes at wait()): a message that could
  // not be built whole is dropped, never sent without its releases.
  TIERMEM_RETURN_IF_ERROR(
      issue_locked_copy(*batch, range, segments, to_memory, olds.data(), released.data(), &stopped));
  TIERMEM_RETURN_IF_ERROR(m_transport.wait(*batch, ScopedDeadline::bound(m_timeout)));
  if (stopped == 0) return Status();
  const uint64_t i = stopped - 1;  // the add_if that stopped it: page i
  if (i >= range.count) return Status(ErrorCode::internal, "a locked copy was stopped by none of its pages");
  *blocked = i;
  *seen = olds[i];
  return Status(ErrorCode::failed_precondition, "page " + std::to_string(range.first_page + i) + " was taken");
}

Status RemoteVersionWords::issue_locked_atomic(TransportBatch& batch, uint64_t page, uint64_t cached, FrameData& data,
                                               uint64_t frame_offset, WordOp op, uint64_t operand, uint64_t compare,
                                               uint64_t* taken, uint64_t* old, uint64_t* released,
                                               uint64_t* stopped, bool coherent) {
  auto* frames = dynamic_cast<RemoteFrameData*>(&data);
  if (frames == nullptr || frames->node().endpoint != m_node->endpoint || !frames->messages(frame_offset, 8)) {
    return Status(ErrorCode::not_supported, "frames elsewhere or one-sided");
  }
  TIERMEM_ASSIGN_OR_RETURN(const RemoteRegion* r, region(page, 1));
  if (m_transport.one_sided(*r->key)) return Status(ErrorCode::not_supported, "one-sided words");
  Endpoint& ep = *m_node->endpoint;
  TIERMEM_RETURN_IF_ERROR(m_transport.reserve(batch, ep, 5, 0, 0));
  if (coherent) {
    // Checked, not taken: nothing is written to the page's word, and a
    // writer's lock does not hold the atomic back (as where it is mapped).
    const WordCondition same_epoch{k_epoch_bits, cached & k_epoch_bits};
    *taken = same_epoch.value;
    TIERMEM_RETURN_IF_ERROR(m_transport.add_if(batch, ep, same_epoch, 0, 0, address(*r, page), *r->key, taken));
    TIERMEM_RETURN_IF_ERROR(frames->issue_atomic(batch, frame_offset, op, operand, compare, old));
    return m_transport.end_group(batch, ep, stopped);
  }
  const WordCondition writable = writable_at(cached);
  *taken = writable.value;
  TIERMEM_RETURN_IF_ERROR(m_transport.add_if(batch, ep, writable, 1, 1, address(*r, page), *r->key, taken));
  TIERMEM_RETURN_IF_ERROR(frames->issue_atomic(batch, frame_offset, op, operand, compare, old));
  TIERMEM_RETURN_IF_ERROR(
      m_transport.atomic(batch, ep, AtomicOp::fetch_add, 1, 0, address(*r, page), *r->key, released));
  return m_transport.end_group(batch, ep, stopped);
}

Status RemoteVersionWords::locked_atomic(uint64_t page, uint64_t cached, FrameData& data, uint64_t frame_offset,
                                         WordOp op, uint64_t operand, uint64_t compare, uint64_t* old,
                                         uint64_t* seen, bool coherent) {
  uint64_t taken = 0, before = 0, released = 0, stopped = 0;
  auto batch = m_transport.batch();
  TIERMEM_RETURN_IF_ERROR(issue_locked_atomic(*batch, page, cached, data, frame_offset, op, operand, compare, &taken,
                                              &before, &released, &stopped, coherent));  // nothing was sent
  TIERMEM_RETURN_IF_ERROR(m_transport.wait(*batch, ScopedDeadline::bound(m_timeout)));
  if (stopped == 0) {
    *old = before;
    return Status();
  }
  *seen = taken;
  return Status(ErrorCode::failed_precondition, "page " + std::to_string(page) + " was taken");
}

// --- frames ------------------------------------------------------------------------

bool RemoteFrameData::persistent() const {
  for (const auto& [domain, r] : m_node->tiers[static_cast<size_t>(m_tier)]) return r.persistent;
  return false;
}

Result<const RemoteRegion*> RemoteFrameData::region(uint64_t frame_offset, size_t length) const {
  const auto& regions = m_node->tiers[static_cast<size_t>(m_tier)];
  const RemoteRegion* r = m_node->frame_region(m_tier, frame_offset, length);
  if (r != nullptr && r->key) return r;
  if (regions.empty()) return unreachable(m_node->node, std::string(tier_name(m_tier)) + " tier");
  // A frame outside every region we hold a key to: of another tenant, or of
  // a domain given out since we learned the node's keys.
  return unreachable(m_node->node, std::string(tier_name(m_tier)) + " frames at offset " + std::to_string(frame_offset));
}

bool RemoteFrameData::messages(uint64_t frame_offset, size_t length) const {
  const RemoteRegion* r = m_node->frame_region(m_tier, frame_offset, length);
  return r != nullptr && r->key && !m_transport.one_sided(*r->key);
}

Status RemoteFrameData::issue_read(TransportBatch& batch, uint64_t frame_offset, void* dst, size_t length) {
  TIERMEM_ASSIGN_OR_RETURN(const RemoteRegion* r, region(frame_offset, length));
  auto* out = static_cast<std::byte*>(dst);
  const uint64_t base = r->base + (frame_offset - r->first);
  const size_t chunk = m_transport.one_sided(*r->key) ? k_remote_chunk : k_message_max_bytes;
  for (size_t done = 0; done < length; done += chunk) {
    const size_t n = std::min(chunk, length - done);
    TIERMEM_RETURN_IF_ERROR(m_transport.get(batch, *m_node->endpoint, out + done, n, base + done, *r->key));
  }
  return Status();
}

Status RemoteFrameData::issue_write(TransportBatch& batch, uint64_t frame_offset, const void* src, size_t length) {
  TIERMEM_ASSIGN_OR_RETURN(const RemoteRegion* r, region(frame_offset, length));
  const auto* in = static_cast<const std::byte*>(src);
  const uint64_t base = r->base + (frame_offset - r->first);
  const bool one_sided = m_transport.one_sided(*r->key);
  const size_t chunk = one_sided ? k_remote_chunk : k_message_max_bytes;
  for (size_t done = 0; done < length; done += chunk) {
    const size_t n = std::min(chunk, length - done);
    TIERMEM_RETURN_IF_ERROR(m_transport.put(batch, *m_node->endpoint, in + done, n, base + done, *r->key));
  }
  if (!one_sided && r->persistent) return m_transport.persist(batch, *m_node->endpoint, base, length, *r->key);
  return Status();
}

Status RemoteFrameData::read(uint64_t frame_offset, void* dst, size_t length) {
  auto batch = m_transport.batch();
  Status s = issue_read(*batch, frame_offset, dst, length);
  Status w = m_transport.wait(*batch, ScopedDeadline::bound(m_timeout));
  return s.ok() ? w : s;
}

Status RemoteFrameData::write(uint64_t frame_offset, const void* src, size_t length) {
  TIERMEM_ASSIGN_OR_RETURN(const RemoteRegion* r, region(frame_offset, length));
  auto batch = m_transport.batch();
  Status s = issue_write(*batch, frame_offset, src, length);
  Status w = m_transport.wait(*batch, ScopedDeadline::bound(m_timeout));
  TIERMEM_RETURN_IF_ERROR(s);
  TIERMEM_RETURN_IF_ERROR(w);
  // A message is answered once the target ran it (persist included).
  if (!m_transport.one_sided(*r->key)) return Status();
  // Completion of a put is local; the flush makes the bytes visible at the
  // target before the caller releases the page lock.
  TIERMEM_RETURN_IF_ERROR(m_transport.flush(*m_node->endpoint, ScopedDeadline::bound(m_timeout)));
  if (r->persistent && m_persist) return m_persist(m_tier, frame_offset, length);
  return Status();
}

Status RemoteFrameData::issue_atomic(TransportBatch& batch, uint64_t frame_offset, WordOp op, uint64_t operand,
                                     uint64_t compare, uint64_t* old) {
  if (frame_offset % 8 != 0) return Status(ErrorCode::invalid_argument, "atomic on an unaligned word");
  TIERMEM_ASSIGN_OR_RETURN(const RemoteRegion* r, region(frame_offset, 8));
  const uint64_t address = r->base + (frame_offset - r->first);
  TIERMEM_RETURN_IF_ERROR(m_transport.atomic(batch, *m_node->endpoint,
                                             op == WordOp::fetch_add ? AtomicOp::fetch_add : AtomicOp::compare_swap,
                                             operand, compare, address, *r->key, old));
  if (r->persistent && !m_transport.one_sided(*r->key)) {
    return m_transport.persist(batch, *m_node->endpoint, address, 8, *r->key);
  }
  return Status();
}

Status RemoteFrameData::atomic(uint64_t frame_offset, WordOp op, uint64_t operand, uint64_t compare,
                               uint64_t* old) {
  if (frame_offset % 8 != 0) return Status(ErrorCode::invalid_argument, "atomic on an unaligned word");
  TIERMEM_ASSIGN_OR_RETURN(const RemoteRegion* r, region(frame_offset, 8));
  auto batch = m_transport.batch();
  const uint64_t address = r->base + (frame_offset - r->first);
  TIERMEM_RETURN_IF_ERROR(m_transport.atomic(*batch, *m_node->endpoint,
                                             op == WordOp::fetch_add ? AtomicOp::fetch_add : AtomicOp::compare_swap,
                                             operand, compare, address, *r->key, old));
  // On the message path the persist travels in the same message.
  const bool in_message = r->persistent && !m_transport.one_sided(*r->key);
  if (in_message) TIERMEM_RETURN_IF_ERROR(m_transport.persist(*batch, *m_node->endpoint, address, 8, *r->key));
  Status s = m_transport.wait(*batch, ScopedDeadline::bound(m_timeout));
  if (s.ok() && r->persistent && !in_message && m_persist) return m_persist(m_tier, frame_offset, 8);
  return s;
}

}  // namespace tiermem
