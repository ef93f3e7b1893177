// Client's data calls (include/tiermem/client.h): reads, writes and atomics,
// host buffers straight and CUDA device buffers through the copy engines or
// staged, and the epochs of a Batch (include/tiermem/batch.h), which send
// what goes by messages as one request per node (ClientCore::start_batch)
// and run the rest as these calls.
#include <algorithm>
#include <memory>
#include <new>
#include <span>
#include <vector>

#include <tiermem/client.h>
#include <tiermem/status_macros.h>

#include "client/batch_item.hpp"
#include "client/client_core.hpp"
#include "client/device_buffers.hpp"

namespace tiermem {

using detail::ClientCore;

namespace {

// Host memory of `length` bytes to stage a device buffer in; nullptr when
// there is none.
std::unique_ptr<std::byte[]> staging(size_t length) { return std::unique_ptr<std::byte[]>(new (std::nothrow) std::byte[length]); }

Status no_staging(size_t length) {
  return Status(ErrorCode::invalid_argument,
                "cannot stage " + std::to_string(length) + " bytes of device memory in host memory (out of memory)");
}

// `copy` on `data` as the library may touch it. A CUDA device buffer goes
// straight to this node's VRAM through the copy engines (`direct`) where the
// range is there, and through host memory otherwise (copied in before a
// write, out after a read).
template <typename F, typename D>
Status on_host(const std::atomic<const ClientCore*>& core, void* data, size_t length, bool to_memory, F&& copy,
               D&& direct) {
  if (length == 0) return copy(data);
  TIERMEM_ASSIGN_OR_RETURN(const detail::BufferKind kind, detail::classify_buffer(data));
  if (kind == detail::BufferKind::host) return copy(data);
  if (Status s = direct(data); s.code() != ErrorCode::not_supported) return s;
  if (const ClientCore* c = core.load(std::memory_order_acquire)) c->count_staged();
  std::unique_ptr<std::byte[]> pageable;
  std::byte* staged = detail::pinned_staging(data, length);
  if (staged == nullptr) {
    pageable = staging(length);
    if (!pageable) return no_staging(length);
    staged = pageable.get();
  }
  if (to_memory) TIERMEM_RETURN_IF_ERROR(detail::copy_from_device(staged, data, length));
  TIERMEM_RETURN_IF_ERROR(copy(staged));
  if (!to_memory) TIERMEM_RETURN_IF_ERROR(detail::copy_to_device(data, staged, length));
  return Status();
}

}  // namespace

size_t Client::run_batch(std::span<detail::BatchItem*> items) {
  using Kind = detail::BatchItem::Kind;
  const auto synchronous = [&](detail::BatchItem& item) {
    const auto atomic = [&](Result<uint64_t> r) {
      item.status = r.status();
      item.value = r.ok() ? *r : 0;
    };
    switch (item.kind) {
      case Kind::read:
        item.status = item.qos ? read(item.gva, item.buffer, item.length, *item.qos)
                               : read(item.gva, item.buffer, item.length);
        break;
      case Kind::write:
        item.status = item.qos ? write(item.gva, item.buffer, item.length, *item.qos)
                               : write(item.gva, item.buffer, item.length);
        break;
      case Kind::fetch_add:
        atomic(item.qos ? fetch_add(item.gva, item.a, *item.qos) : fetch_add(item.gva, item.a));
        break;
      case Kind::compare_swap:
        atomic(item.qos ? compare_swap(item.gva, item.a, item.b, *item.qos) : compare_swap(item.gva, item.a, item.b));
        break;
    }
    item.handled = true;
  };
  // Device buffers go by their calls (the copy engines, or staged).
  const auto on_host = [](const detail::BatchItem& item) {
    if (item.kind != Kind::read && item.kind != Kind::write) return true;
    auto kind = detail::classify_buffer(item.buffer);
    return kind.ok() && *kind == detail::BufferKind::host;
  };
  std::shared_ptr<ClientCore> c = core();
  const bool lost = c->lost();  // the calls connect again
  // Several epochs to one node by messages: one message, barriers for fences.
  if (!lost && items.size() > 1 && items.front()->epoch != items.back()->epoch &&
      std::all_of(items.begin(), items.end(), [&](const detail::BatchItem* i) { return on_host(*i); })) {
    if (auto flight = c->start_chain(items)) {
      c->finish_batch(*flight);
      // What did not go through, in posting order: epoch after epoch.
      for (detail::BatchItem* item : items) {
        if (!item->handled) synchronous(*item);
      }
      return items.size();
    }
  }
  size_t n = 0;
  while (n < items.size() && items[n]->epoch == items.front()->epoch) ++n;
  std::span<detail::BatchItem*> epoch = items.first(n);
  std::vector<detail::BatchItem*> direct;
  for (detail::BatchItem* item : epoch) {
    if (!lost && on_host(*item)) direct.push_back(item);
  }
  auto flight = c->start_batch(direct);
  // What is not on its way runs meanwhile (the daemon's path, another class).
  for (detail::BatchItem* item : epoch) {
    if (!item->in_flight && !item->handled) synchronous(*item);
  }
  c->finish_batch(*flight);
  for (detail::BatchItem* item : epoch) {
    if (!item->handled) synchronous(*item);
  }
  return n;
}

Status Client::copy_device(Gva gva, void* data, size_t length, bool to_memory) {
  return run(to_memory ? "write" : "read", true, [&](detail::ClientCore& c) {
    return c.copy_device(gva, static_cast<std::byte*>(data), length, to_memory);
  });
}

Status Client::write(Gva gva, const void* data, size_t length) {
  return on_host(
      m_current, const_cast<void*>(data), length, true,
      [&](void* p) { return run("write", true, [&](ClientCore& c) { return c.write(gva, p, length); }); },
      [&](void* p) { return copy_device(gva, p, length, true); });
}

Status Client::read(Gva gva, void* data, size_t length) {
  return on_host(
      m_current, data, length, false,
      [&](void* p) { return run("read", true, [&](ClientCore& c) { return c.read(gva, p, length); }); },
      [&](void* p) { return copy_device(gva, p, length, false); });
}

Status Client::write(Gva gva, const void* data, size_t length, QosClass qos) {
  return on_host(
      m_current, const_cast<void*>(data), length, true,
      [&](void* p) { return run("write", true, [&](ClientCore& c) { return c.write(gva, p, length, qos); }); },
      [&](void* p) { return copy_device(gva, p, length, true); });
}

Status Client::read(Gva gva, void* data, size_t length, QosClass qos) {
  return on_host(
      m_current, data, length, false,
      [&](void* p) { return run("read", true, [&](ClientCore& c) { return c.read(gva, p, length, qos); }); },
      [&](void* p) { return copy_device(gva, p, length, false); });
}

Result<uint64_t> Client::fetch_add(Gva gva, uint64_t value) {
  uint64_t out = 0;
  if (std::shared_ptr<ClientCore> c = core(); !c->lost() && c->short_atomic(gva, WordOp::fetch_add, value, 0, &out)) {
    return out;
  }
  TIERMEM_RETURN_IF_ERROR(run("fetch_add", false, [&](ClientCore& c) {
    TIERMEM_ASSIGN_OR_RETURN(out, c.atomic(gva, WordOp::fetch_add, value, 0));
    return Status();
  }));
  return out;
}

Result<uint64_t> Client::fetch_add(Gva gva, uint64_t value, QosClass qos) {
  uint64_t out = 0;
  TIERMEM_RETURN_IF_ERROR(run("fetch_add", false, [&](ClientCore& c) {
    TIERMEM_ASSIGN_OR_RETURN(out, c.atomic(gva, WordOp::fetch_add, value, 0, qos));
    return Status();
  }));
  return out;
}

Result<uint64_t> Client::compare_swap(Gva gva, uint64_t expected, uint64_t desired, QosClass qos) {
  uint64_t out = 0;
  TIERMEM_RETURN_IF_ERROR(run("compare_swap", false, [&](ClientCore& c) {
    TIERMEM_ASSIGN_OR_RETURN(out, c.atomic(gva, WordOp::compare_swap, desired, expected, qos));
    return Status();
  }));
  return out;
}

Result<uint64_t> Client::compare_swap(Gva gva, uint64_t expected, uint64_t desired) {
  uint64_t out = 0;
  if (std::shared_ptr<ClientCore> c = core();
      !c->lost() && c->short_atomic(gva, WordOp::compare_swap, desired, expected, &out)) {
    return out;
  }
  TIERMEM_RETURN_IF_ERROR(run("compare_swap", false, [&](ClientCore& c) {
    TIERMEM_ASSIGN_OR_RETURN(out, c.atomic(gva, WordOp::compare_swap, desired, expected));
    return Status();
  }));
  return out;
}

}  // namespace tiermem
