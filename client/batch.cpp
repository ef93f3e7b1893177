// Batches (include/tiermem/batch.h): the operations posted between fences
// go to Client::run_batch together, which sends those on the message path
// to other nodes as one message per node (client_batch.cpp) and runs the
// rest as their synchronous calls; an epoch starts once the one before it
// has completed. They run on the thread that waits (no hand-off), or, once
// submit() was called, on a pool of library threads shared by the process
// (TIERMEM_BATCH_THREADS, default 1) while the caller goes on.
#include <tiermem/batch.h>

#include <algorithm>
#include <condition_variable>
#include <cstdlib>
#include <deque>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

#include "client/batch_item.hpp"

namespace tiermem {
namespace detail {
namespace {

// Threads that run batch operations, for every batch of the process. Never
// destroyed: its threads wait on it until the process exits.
class BatchPool {
 public:
  static BatchPool& instance() {
    static BatchPool* pool = new BatchPool(threads());
    return *pool;
  }
  void submit(std::function<void()> work) {
    {
      std::lock_guard lock(m_mutex);
      m_queue.push_back(std::move(work));
    }
    m_ready.notify_one();
  }

 private:
  static size_t threads() {
    const char* e = std::getenv("TIERMEM_BATCH_THREADS");
    // One by default: see batch.h (concurrent waits on one UCX worker).
    const long n = e != nullptr ? std::strtol(e, nullptr, 10) : 1;
    return static_cast<size_t>(n < 1 ? 1 : n > 256 ? 256 : n);
  }
  explicit BatchPool(size_t n) {
    for (size_t i = 0; i < n; ++i) std::thread([this] { run(); }).detach();
  }
  void run() {
    for (;;) {
      std::function<void()> work;
      {
        std::unique_lock lock(m_mutex);
        m_ready.wait(lock, [&] { return !m_queue.empty(); });
        work = std::move(m_queue.front());
        m_queue.pop_front();
      }
      work();
    }
  }
  std::mutex m_mutex;
  std::condition_variable m_ready;
  std::deque<std::function<void()>> m_queue;
};

}  // namespace

struct BatchOp {
  BatchItem item;
  bool done = false;
};

struct BatchState : std::enable_shared_from_this<BatchState> {
  Client* client = nullptr;
  BatchOptions options;
  mutable std::mutex mutex;
  std::condition_variable changed;
  std::deque<BatchOp> ops;  // stable addresses while more are posted
  size_t epoch = 0;         // of the next operation posted
  size_t sent = 0;          // ops[0, sent) were submitted
  size_t done = 0;          // ops[0, done) completed (they run in order of epochs)
  bool running = false;     // a thread runs the submitted ones

  // Runs what was submitted (an epoch, or several chained in one message:
  // Client::run_batch), until nothing submitted is left. The caller set
  // `running`.
  void run_submitted() {
    std::unique_lock lock(mutex);
    while (done < sent) {
      std::vector<BatchItem*> items;
      for (size_t i = done; i < sent; ++i) items.push_back(&ops[i].item);
      lock.unlock();
      const size_t n = std::max<size_t>(1, client->run_batch(items));
      lock.lock();
      for (size_t i = done; i < done + n; ++i) ops[i].done = true;
      done += n;
      changed.notify_all();
    }
    running = false;
    changed.notify_all();
  }

  // Submits every operation posted; with `here`, runs them on this thread
  // when no other runs this batch's operations. Caller holds `lock`.
  void submit(std::unique_lock<std::mutex>& lock, bool here) {
    sent = ops.size();
    if (running || done == sent) return;
    running = true;
    if (!here) {
      BatchPool::instance().submit([self = shared_from_this()] { self->run_submitted(); });
      return;
    }
    lock.unlock();
    run_submitted();
    lock.lock();
  }

  size_t post(BatchItem item) {
    item.qos = options.qos;
    std::lock_guard lock(mutex);
    item.epoch = epoch;
    ops.push_back({std::move(item), false});
    return ops.size() - 1;
  }
};

}  // namespace detail

Batch::Batch(Client& client, const BatchOptions& options) : m_state(std::make_shared<detail::BatchState>()) {
  m_state->client = &client;
  m_state->options = options;
}

Batch::~Batch() {
  if (m_state) (void)wait(std::chrono::hours(24 * 365));
}

Batch::Batch(Batch&&) noexcept = default;

Batch& Batch::operator=(Batch&& other) noexcept {
  if (this != &other) {
    if (m_state) (void)wait(std::chrono::hours(24 * 365));
    m_state = std::move(other.m_state);
  }
  return *this;
}

size_t Batch::read(Gva gva, void* data, size_t length) {
  return m_state->post({.kind = detail::BatchItem::Kind::read, .gva = gva,
                        .buffer = static_cast<std::byte*>(data), .length = length});
}

size_t Batch::write(Gva gva, const void* data, size_t length) {
  return m_state->post({.kind = detail::BatchItem::Kind::write, .gva = gva,
                        .buffer = static_cast<std::byte*>(const_cast<void*>(data)), .length = length});
}

size_t Batch::fetch_add(Gva gva, uint64_t value) {
  return m_state->post({.kind = detail::BatchItem::Kind::fetch_add, .gva = gva, .a = value});
}

size_t Batch::compare_swap(Gva gva, uint64_t expected, uint64_t desired) {
  return m_state->post({.kind = detail::BatchItem::Kind::compare_swap, .gva = gva, .a = expected, .b = desired});
}

void Batch::fence() {
  std::lock_guard lock(m_state->mutex);
  // A fence with nothing after it before the next one is one fence.
  if (!m_state->ops.empty() && m_state->ops.back().item.epoch == m_state->epoch) ++m_state->epoch;
}

void Batch::submit() {
  std::unique_lock lock(m_state->mutex);
  m_state->submit(lock, false);
}

Status Batch::wait(std::chrono::milliseconds timeout) {
  detail::BatchState& b = *m_state;
  std::unique_lock lock(b.mutex);
  b.submit(lock, true);
  if (!b.changed.wait_for(lock, timeout, [&] { return b.done == b.ops.size(); })) {
    return Status(ErrorCode::timeout, std::to_string(b.ops.size() - b.done) + " of " + std::to_string(b.ops.size()) +
                                          " operations of the batch had not completed after " +
                                          std::to_string(timeout.count()) + " ms");
  }
  for (size_t i = 0; i < b.ops.size(); ++i) {
    if (!b.ops[i].item.status.ok()) {
      return b.ops[i].item.status.with_context("operation " + std::to_string(i) + " of the batch (" +
                                               b.ops[i].item.gva.to_string() + ")");
    }
  }
  return Status();
}

bool Batch::test() {
  std::unique_lock lock(m_state->mutex);
  m_state->submit(lock, false);
  return m_state->done == m_state->ops.size();
}

size_t Batch::size() const {
  std::lock_guard lock(m_state->mutex);
  return m_state->ops.size();
}

Status Batch::status(size_t index) const {
  std::lock_guard lock(m_state->mutex);
  if (index >= m_state->ops.size()) {
    return Status(ErrorCode::out_of_range, "operation " + std::to_string(index) + " of a batch of " +
                                               std::to_string(m_state->ops.size()));
  }
  const detail::BatchOp& op = m_state->ops[index];
  return op.done ? op.item.status : Status(ErrorCode::busy, index < m_state->sent ? "still running" : "not submitted yet");
}

uint64_t Batch::value(size_t index) const {
  std::lock_guard lock(m_state->mutex);
  return index < m_state->ops.size() && m_state->ops[index].done ? m_state->ops[index].item.value : 0;
}

}  // namespace tiermem
