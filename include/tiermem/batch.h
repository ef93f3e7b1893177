// Batches (C5): many reads, writes and atomics posted at once, to one or many
// nodes, each with its own completion, then waited for or tested.
//
//   tiermem::Batch b(*client);
//   for (int i = 0; i < 64; ++i) b.read(shard[i], buffers[i], 4096);
//   b.fence();                       // what follows starts once all before is done
//   size_t n = b.fetch_add(counter, 1);
//   b.submit();                      // on their way; the caller goes on
//   ...                              // compute
//   Status s = b.wait();             // the first error, or OK
//   uint64_t before = b.value(n);    // b.status(i): each operation's own
//
// Operations posted are sent at submit() (or test(), or wait()): those
// between two fences on another node's memory reached by messages (TCP,
// shared memory between daemons) travel as ONE message per node, each
// operation its own group there (a page held by someone else stops its
// operation only, which then runs again by itself); the others run as the
// synchronous call (Client::read, ...) would, with the same guarantees and
// errors. No order holds between operations but at fences: an epoch starts
// once every operation before the fence has completed (whatever its
// outcome). After submit() they run on a pool of the library's threads
// (TIERMEM_BATCH_THREADS, default 1) while the caller goes on; wait()
// without submit() runs them on the calling thread (no hand-off). A node
// that fails mid-batch fails only its own operations, naming it; an atomic
// that may have run there is failed, never repeated.
// The buffers given must stay valid, and untouched by the caller, until the
// batch has completed (wait() returned, or test() said so); destroying a
// batch runs and waits for what was posted.
//
// Thread-compatible: one thread posts into and waits on a batch at a time.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>

#include <tiermem/client.h>
#include <tiermem/export.h>
#include <tiermem/gva.h>
#include <tiermem/status.h>
#include <tiermem/types.h>

namespace tiermem {

struct BatchOptions {
  // The QoS class of every operation (its deadline, H3); none: each
  // allocation's own class.
  std::optional<QosClass> qos;
};

namespace detail {
struct BatchState;
}

class TIERMEM_EXPORT Batch {
 public:
  // `client` must outlive the batch.
  explicit Batch(Client& client, const BatchOptions& options = {});
  ~Batch();
  Batch(Batch&&) noexcept;
  Batch& operator=(Batch&&) noexcept;
  Batch(const Batch&) = delete;
  Batch& operator=(const Batch&) = delete;

  // Each returns the operation's index, for status() and value().
  size_t read(Gva gva, void* data, size_t length);
  size_t write(Gva gva, const void* data, size_t length);
  size_t fetch_add(Gva gva, uint64_t value);
  size_t compare_swap(Gva gva, uint64_t expected, uint64_t desired);
  // Operations posted after it start once every one posted before it has
  // completed (whatever its outcome).
  void fence();

  // Sends what was posted since, to run on the library's threads while the
  // caller goes on.
  void submit();
  // Submits what was posted and waits until every operation has completed
  // (running them on this thread when no library thread does); returns the
  // first error in posting order (its index and message), or OK. timeout
  // after `timeout` (the operations go on; wait again, or destroy the
  // batch, which waits).
  Status wait(std::chrono::milliseconds timeout = std::chrono::minutes(10));
  // Submits what was posted; whether every operation has completed (does
  // not block).
  bool test();

  size_t size() const;
  // Operation `index`'s outcome: OK, its error, or busy until it completed.
  Status status(size_t index) const;
  // The value before an atomic (0 for reads and writes, and until done).
  uint64_t value(size_t index) const;

 private:
  std::shared_ptr<detail::BatchState> m_state;
};

}  // namespace tiermem
