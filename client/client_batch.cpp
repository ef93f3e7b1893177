// A client Batch's operations on other nodes' memory as one message per node
// (ClientCore::run_batch; include/tiermem/batch.h).
//
// Each operation becomes one group of its node's message (Transport::
// end_group), built by the same compounds the synchronous calls send alone
// (access/remote_memory.hpp): a read is the words, the bytes and the words
// again; a write takes its pages, puts, persists and lets go; an atomic
// takes its page, runs and lets go. The node runs the groups in order; a
// page it cannot take stops that group only. The messages of every node go
// out together, then are waited for. Whatever did not settle that way (a
// page taken, a read a writer spoiled, a stale translation, a node that
// failed) goes back to the caller, which runs its synchronous call: the
// one place that waits for pages, refreshes translations and reconnects.
#include <algorithm>
#include <cstring>
#include <deque>
#include <map>

#include "access/remote_memory.hpp"
#include "client/client_core.hpp"
#include "common/deadline.hpp"
#include "pages/version.hpp"

namespace tiermem::detail {
namespace {

// Another node's words and frames as one RemoteState reaches them, and
// nothing else.
class RemoteOnlyAccess final : public MemoryAccess {
 public:
  explicit RemoteOnlyAccess(RemoteState& state) : m_state(state) {}
  Result<VersionWords*> versions(NodeId home, uint64_t) override {
    if (home != m_state.node->node || !m_state.words) return Status(ErrorCode::not_supported, "another node");
    return static_cast<VersionWords*>(m_state.words.get());
  }
  Result<FrameData*> frames(NodeId node, Tier tier) override {
    RemoteFrameData* f = node == m_state.node->node ? m_state.frames[static_cast<size_t>(tier)].get() : nullptr;
    if (f == nullptr) return Status(ErrorCode::not_supported, "frames elsewhere");
    return static_cast<FrameData*>(f);
  }

 private:
  RemoteState& m_state;
};

// One operation in a node's message, and what its answer fills in.
struct Posted {
  BatchItem* item = nullptr;
  std::shared_ptr<const CachedAllocation> alloc;  // its page words are the range's cached ones
  std::shared_ptr<RemoteState> state;
  CopyPlan plan;
  std::vector<uint64_t> first, second;  // a read's words before and after; a write's taken and released
  uint64_t stopped = 0, taken = 0, old = 0, released = 0;
  bool locked = false;    // a read that took its pages (a chain's)
  size_t barriers = 0;    // of the flight's, issued before it (a chain's)
};

// Operations chained in one message at most (ClientCore::start_chain).
constexpr size_t k_chain_items = 512;

bool is_atomic(const BatchItem& item) {
  return item.kind == BatchItem::Kind::fetch_add || item.kind == BatchItem::Kind::compare_swap;
}

// Whether the words a read saw before and after its bytes make them one
// consistent snapshot of the translation it was planned with.
bool consistent(const Posted& p) {
  const PageRange& range = p.plan.range;
  for (uint64_t i = 0; i < range.count; ++i) {
    if (version::epoch_of(p.first[i]) != version::epoch_of(range.cached[i])) return false;
    if (version::is_locked(p.first[i])) return false;
  }
  return std::memcmp(p.first.data(), p.second.data(), range.count * sizeof(uint64_t)) == 0;
}

}  // namespace

struct ClientCore::BatchFlight {
  std::deque<Posted> posted;  // stable addresses: answers land in them
  std::map<Endpoint*, std::unique_ptr<TransportBatch>> batches;
  // Reads and writes of memory mapped here (this node's, or a daemon's of
  // this host): copied while the messages travel.
  std::vector<BatchItem*> mapped;
  std::deque<uint64_t> barriers;  // a chain's, one per fence: 1 when it stopped the message
};

Status ClientCore::post_batch_item(BatchItem& item, BatchFlight& flight, bool locked_reads) {
  const Status no(ErrorCode::not_supported, "not on the message path");
  const bool atomic = is_atomic(item);
  if (atomic ? item.gva.offset % 8 != 0 : item.length == 0) return no;
  if (class_of(item.gva, item.qos) != QosClass::standard) return no;
  auto a = cached(item.gva, false);
  if (!a.ok() || (*a)->changes_through_home) return no;
  const CachedAllocation& alloc = **a;
  const uint64_t offset = item.gva.offset - alloc.base.offset;
  const uint64_t length = atomic ? 8 : item.length;
  if (offset > alloc.size || length > alloc.size - offset || !check_remote_extents(alloc).ok()) return no;
  auto routed_alloc = routed(*a, false);
  const Extent* x = extent_at(alloc, offset);
  if (x == nullptr) return no;
  const Path path = atomic ? std::max(routed_alloc->routes->words, routed_alloc->routes->extents[x - alloc.extents.data()])
                           : path_of(*routed_alloc, offset, length);
  if (path == Path::local || path == Path::mapped) {
    flight.mapped.push_back(&item);
    return Status();
  }
  if (path != Path::message) return no;
  auto state = remote(alloc.base.node);
  if (!state.ok() || !(*state)->words) return no;

  Posted& p = flight.posted.emplace_back();
  p.item = &item;
  p.barriers = flight.barriers.size();
  p.alloc = routed_alloc;
  p.state = *state;
  RemoteVersionWords& words = *p.state->words;
  auto& batch = flight.batches[p.state->node->endpoint.get()];
  if (!batch) batch = m_nodes.transport()->batch();
  RemoteOnlyAccess access(*p.state);
  Status s;
  if (!atomic) {
    s = plan_copy(layout_of(*p.alloc), access, offset, item.buffer, item.length, &p.plan);
    p.first.resize(p.plan.range.count);
    p.second.resize(p.plan.range.count);
    p.locked = locked_reads && item.kind == BatchItem::Kind::read;
    if (s.ok() && item.kind == BatchItem::Kind::read && !p.locked) {
      s = words.issue_snapshot(*batch, p.plan.range.first_page, p.plan.range.count, p.plan.segments,
                               p.first.data(), p.second.data());
    } else if (s.ok()) {
      s = words.issue_locked_copy(*batch, p.plan.range, p.plan.segments, item.kind == BatchItem::Kind::write,
                                  p.first.data(), p.second.data(), &p.stopped);
    }
  } else {
    auto frames = access.frames(x->node, x->tier);
    const uint64_t index = offset / page_size();  // as the synchronous call's
    const uint64_t frame_offset = x->frame_offset + (offset - x->gva_offset);
    const WordOp op = item.kind == BatchItem::Kind::fetch_add ? WordOp::fetch_add : WordOp::compare_swap;
    // compare_swap: a the expected word, b the one stored.
    const uint64_t operand = op == WordOp::fetch_add ? item.a : item.b;
    auto* remote_frames = frames.ok() ? static_cast<RemoteFrameData*>(*frames) : nullptr;
    s = frames.status();
    if (s.ok() && index >= alloc.page_versions.size()) s = no;
    if (s.ok()) {
      // Taken, run and released in one request at the home, as the
      // synchronous call's (a coherent page checked there, not taken).
      s = words.issue_locked_atomic(*batch, alloc.first_page + index, alloc.page_versions[index], *remote_frames,
                                    frame_offset, op, operand, item.a, &p.taken, &p.old, &p.released, &p.stopped,
                                    alloc.coherent);
      // One-sided (not_supported, nothing added): its synchronous call runs
      // it, locking the page, a coherent one's too (atomic_once says why).
    }
  }
  // The compounds check everything before they add an operation: one that
  // failed added none (its synchronous call says why).
  if (!s.ok()) flight.posted.pop_back();
  return s;
}

std::shared_ptr<ClientCore::BatchFlight> ClientCore::start_batch(std::span<BatchItem*> items) {
  auto flight = std::make_shared<BatchFlight>();
  if (!m_direct || m_daemon_lost.load(std::memory_order_relaxed)) return flight;
  for (BatchItem* item : items) {
    if (!item->handled) item->in_flight = post_batch_item(*item, *flight).ok();
  }
  for (auto& [ep, batch] : flight->batches) m_nodes.transport()->send(*batch);
  for (BatchItem* item : flight->mapped) {
    item->in_flight = false;
    if (is_atomic(*item)) {
      // Settled whatever the outcome: an atomic is never run twice.
      const bool add = item->kind == BatchItem::Kind::fetch_add;
      auto r = add ? atomic(item->gva, WordOp::fetch_add, item->a, 0)
                   : atomic(item->gva, WordOp::compare_swap, item->b, item->a);
      item->status = r.status();
      item->value = r.ok() ? *r : 0;
      item->handled = true;
      continue;
    }
    // Settled only when it went through: else its synchronous call (which
    // connects again when the daemon went away) runs it.
    if (copy(item->gva, item->buffer, item->length, item->kind == BatchItem::Kind::write).ok()) {
      item->status = Status();
      item->handled = true;
    }
  }
  return flight;
}

std::shared_ptr<ClientCore::BatchFlight> ClientCore::start_chain(std::span<BatchItem*> items) {
  if (!m_direct || m_daemon_lost.load(std::memory_order_relaxed) || items.size() > k_chain_items) return nullptr;
  // All of it in one message (so that reserve() never sends part of it):
  // a bound on its operations and bytes before anything is posted.
  size_t ops = 0, bytes = 0;
  for (const BatchItem* item : items) {
    const size_t pages = item->length / page_size() + 2;
    ops += 4 * pages + 6;
    bytes += item->length;
  }
  if (ops + items.size() > k_message_max_ops || bytes > k_message_max_bytes / 2) return nullptr;
  auto flight = std::make_shared<BatchFlight>();
  Endpoint* endpoint = nullptr;
  for (size_t i = 0; i < items.size(); ++i) {
    BatchItem& item = *items[i];
    if (i > 0 && item.epoch != items[i - 1]->epoch) {
      // Everything so far went to `endpoint`'s message.
      if (!m_nodes.transport()->barrier(*flight->batches.begin()->second, *endpoint, &flight->barriers.emplace_back()).ok()) {
        return nullptr;
      }
    }
    // Not posted, or not by messages to the one node: no chain (the batch
    // was never sent, and is dropped).
    if (!post_batch_item(item, *flight, true).ok() || !flight->mapped.empty() || flight->batches.size() != 1) {
      return nullptr;
    }
    endpoint = flight->batches.begin()->first;
  }
  for (BatchItem* item : items) item->in_flight = true;
  m_nodes.transport()->send(*flight->batches.begin()->second);
  return flight;
}

void ClientCore::finish_batch(BatchFlight& flight) {
  std::map<Endpoint*, Status> outcome;
  for (auto& [ep, batch] : flight.batches) {
    outcome[ep] = m_nodes.transport()->wait(*batch, ScopedDeadline::bound(m_nodes.timeout()));
  }
  for (Posted& p : flight.posted) {
    BatchItem& item = *p.item;
    item.in_flight = false;
    Endpoint* ep = p.state->node->endpoint.get();
    const Status& w = outcome[ep];
    // A barrier before it stopped the message: it did not run.
    if (w.ok() && std::any_of(flight.barriers.begin(), flight.barriers.begin() + static_cast<ptrdiff_t>(p.barriers),
                              [](uint64_t b) { return b != 0; })) {
      continue;
    }
    if (!w.ok()) {
      const bool unknown = w.code() == ErrorCode::transport_error || w.code() == ErrorCode::timeout;
      if (is_atomic(item) && unknown) {
        // It may have run: an atomic is never applied twice.
        item.status = w.with_context("atomic on " + item.gva.to_string() + " in a batch, at node " +
                                     std::to_string(p.state->node->node) + " (its outcome is unknown)");
        item.handled = true;
      }
      if (ep->failed()) drop_remote(p.state->node->node);
      continue;  // reads and writes go again, synchronously (which reconnects)
    }
    bool settled = false;
    switch (item.kind) {
      case BatchItem::Kind::read: settled = p.locked ? p.stopped == 0 : consistent(p); break;
      case BatchItem::Kind::write: settled = p.stopped == 0; break;
      default: settled = p.stopped == 0; break;
    }
    if (!settled) continue;  // a page taken or spoiled, or the translation stale: synchronously
    item.status = Status();
    item.value = is_atomic(item) ? p.old : 0;
    item.handled = true;
    count(Path::message);
  }
}

}  // namespace tiermem::detail
