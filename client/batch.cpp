// Batches (include/tiermem/batch.h): operations posted into a batch run on a
// pool of library threads shared by the process, each as its synchronous
// call; fences hold back what follows until what precedes has completed.
//
// Why threads and not one message per node: the page protocol's remote
// operations (access/) wait for their answer inside the call, so threads
// were the way to overlap them without changing that layer. Measured on two
// cores they do not pay (TCP round trips are CPU-bound there; batch.h), so
// the pool has one thread by default. Amortising the page protocol over a batch
// (one message per node for all its operations) is the next step (issue 31);
// this is the interface it will run behind, with its semantics tested.
#include <tiermem/batch.h>

#include <condition_variable>
#include <cstdlib>
#include <deque>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

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
  enum Kind { read, write, fetch_add, compare_swap } kind;
  Gva gva;
  void* dst = nullptr;
  const void* src = nullptr;
  size_t length = 0;
  uint64_t a = 0, b = 0;
  size_t epoch = 0;  // fences before it
  bool done = false;
  Status status = Status(ErrorCode::busy, "still running");
  uint64_t value = 0;
};

struct BatchState : std::enable_shared_from_this<BatchState> {
  Client* client = nullptr;
  BatchOptions options;
  mutable std::mutex mutex;
  std::condition_variable all_done;
  std::deque<BatchOp> ops;      // stable addresses while more are posted
  std::vector<size_t> pending;  // per epoch: posted, not yet done
  size_t epoch = 0;             // of the next operation posted
  size_t started = 0;           // ops[0, started) were handed to the pool
  size_t done = 0;

  // Hands the pool every operation whose earlier epochs have all completed.
  // Caller holds `mutex`.
  void start_ready() {
    while (started < ops.size()) {
      const size_t e = ops[started].epoch;
      for (size_t earlier = 0; earlier < e; ++earlier) {
        if (pending[earlier] != 0) return;
      }
      BatchOp* op = &ops[started++];
      BatchPool::instance().submit([self = shared_from_this(), op] { self->run(*op); });
    }
  }

  void run(BatchOp& op) {
    Status s;
    uint64_t value = 0;
    Client& c = *client;
    const auto atomic = [&](Result<uint64_t> r) {
      s = r.status();
      if (r.ok()) value = *r;
    };
    switch (op.kind) {
      case BatchOp::read:
        s = options.qos ? c.read(op.gva, op.dst, op.length, *options.qos) : c.read(op.gva, op.dst, op.length);
        break;
      case BatchOp::write:
        s = options.qos ? c.write(op.gva, op.src, op.length, *options.qos) : c.write(op.gva, op.src, op.length);
        break;
      case BatchOp::fetch_add:
        atomic(options.qos ? c.fetch_add(op.gva, op.a, *options.qos) : c.fetch_add(op.gva, op.a));
        break;
      case BatchOp::compare_swap:
        atomic(options.qos ? c.compare_swap(op.gva, op.a, op.b, *options.qos) : c.compare_swap(op.gva, op.a, op.b));
        break;
    }
    std::lock_guard lock(mutex);
    op.status = std::move(s);
    op.value = value;
    op.done = true;
    ++done;
    if (--pending[op.epoch] == 0) start_ready();
    if (done == ops.size()) all_done.notify_all();
  }

  size_t post(BatchOp op) {
    std::lock_guard lock(mutex);
    op.epoch = epoch;
    if (pending.size() <= epoch) pending.resize(epoch + 1, 0);
    ++pending[epoch];
    ops.push_back(std::move(op));
    start_ready();
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
  return m_state->post({.kind = detail::BatchOp::read, .gva = gva, .dst = data, .length = length});
}

size_t Batch::write(Gva gva, const void* data, size_t length) {
  return m_state->post({.kind = detail::BatchOp::write, .gva = gva, .src = data, .length = length});
}

size_t Batch::fetch_add(Gva gva, uint64_t value) {
  return m_state->post({.kind = detail::BatchOp::fetch_add, .gva = gva, .a = value});
}

size_t Batch::compare_swap(Gva gva, uint64_t expected, uint64_t desired) {
  return m_state->post({.kind = detail::BatchOp::compare_swap, .gva = gva, .a = expected, .b = desired});
}

void Batch::fence() {
  std::lock_guard lock(m_state->mutex);
  // A fence with nothing after it before the next one is one fence.
  if (!m_state->ops.empty() && m_state->ops.back().epoch == m_state->epoch) ++m_state->epoch;
}

Status Batch::wait(std::chrono::milliseconds timeout) {
  detail::BatchState& b = *m_state;
  std::unique_lock lock(b.mutex);
  if (!b.all_done.wait_for(lock, timeout, [&] { return b.done == b.ops.size(); })) {
    return Status(ErrorCode::timeout, std::to_string(b.ops.size() - b.done) + " of " + std::to_string(b.ops.size()) +
                                          " operations of the batch had not completed after " +
                                          std::to_string(timeout.count()) + " ms");
  }
  for (size_t i = 0; i < b.ops.size(); ++i) {
    if (!b.ops[i].status.ok()) {
      return b.ops[i].status.with_context("operation " + std::to_string(i) + " of the batch (" +
                                          b.ops[i].gva.to_string() + ")");
    }
  }
  return Status();
}

bool Batch::test() const {
  std::lock_guard lock(m_state->mutex);
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
  return m_state->ops[index].status;
}

uint64_t Batch::value(size_t index) const {
  std::lock_guard lock(m_state->mutex);
  return index < m_state->ops.size() && m_state->ops[index].done ? m_state->ops[index].value : 0;
}

}  // namespace tiermem
