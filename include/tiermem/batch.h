// Batches (C5): many reads, writes and atomics posted at once, to one or many
// nodes, each with its own completion, then waited for or tested.
//
//   tiermem::Batch b(*client);
//   for (int i = 0; i < 64; ++i) b.read(shard[i], buffers[i], 4096);
//   b.fence();                       // what follows starts once all before is done
//   size_t n = b.fetch_add(counter, 1);
//   Status s = b.wait();             // the first error, or OK
//   uint64_t before = b.value(n);    // b.status(i): each operation's own
//
// Operations start as soon as they are posted (those after a fence once
// every operation before it has completed) and run on a pool of the
// library's threads shared by the process's clients (TIERMEM_BATCH_THREADS,
// default 1). Each is the same operation as the synchronous call
// (Client::read, ...), with the same guarantees and errors; no order holds
// between operations but at fences. Not faster yet: on the two-core machine
// it was measured on, TCP round trips are CPU-bound, and 8 threads got
// 0.55-0.76 of one call at a time (bench/batch_bench); the default runs a
// batch's operations one after another, beside the caller. One message per
// node for a batch's operations is the work that makes batches pay (issue 31).
// The buffers given must stay valid, and untouched by the caller, until the
// batch has completed (wait() returned, or test() said so); destroying a
// batch waits for its operations.
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

  // Waits until every operation posted has completed; returns the first
  // error in posting order (its index and message), or OK. timeout after
  // `timeout` (the operations go on; wait again, or destroy the batch,
  // which waits).
  Status wait(std::chrono::milliseconds timeout = std::chrono::minutes(10));
  // Whether every operation posted has completed (does not block).
  bool test() const;

  size_t size() const;
  // Operation `index`'s outcome: OK, its error, or busy while it runs.
  Status status(size_t index) const;
  // The value before an atomic (0 for reads and writes, and until done).
  uint64_t value(size_t index) const;

 private:
  std::shared_ptr<detail::BatchState> m_state;
};

}  // namespace tiermem
