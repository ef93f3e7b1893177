#include "executor/runtime/job.hpp"

#include <thread>

#include <tiermem/status_macros.h>

namespace tiermem::exec {
namespace {

using Clock = std::chrono::steady_clock;

// Spin, yield, then sleep a little longer each time (up to 1 ms).
class Backoff {
 public:
  void pause() {
    if (++m_rounds < 64) return;
    if (m_rounds < 256) {
      std::this_thread::yield();
      return;
    }
    std::this_thread::sleep_for(std::chrono::microseconds(std::min<int64_t>(1000, m_rounds - 250)));
  }

 private:
  int64_t m_rounds = 0;
};

}  // namespace

std::string JobDirectory::name(int rank, const std::string& what) const {
  return m_job + ".r" + std::to_string(rank) + "." + what;
}

Result<OwnRegion> JobDirectory::own(const std::string& what, uint64_t size, AllocOptions options) {
  const std::string n = name(m_rank, what);
  OwnRegion region;
  auto found = m_client.lookup(n);
  if (found.ok()) {
    if (found->size != size) {
      return Status(ErrorCode::already_exists,
                    "allocation " + n + " exists with " + std::to_string(found->size) + " bytes, not " +
                        std::to_string(size) + ": another job of this name (pick another --job, or free it)");
    }
    region.gva = found->gva;
    region.existed = true;
  } else if (found.status().code() == ErrorCode::not_found) {
    options.name = n;
    auto a = m_client.alloc(size, options);
    if (!a.ok()) return a.status().with_context("allocating " + n);
    region.gva = a->gva;
  } else {
    return found.status();
  }
  auto m = m_client.map(region.gva);
  if (!m.ok()) return m.status().with_context("mapping " + n);
  region.mapping = std::move(m).value();
  return region;
}

Result<Gva> JobDirectory::peer(int rank, const std::string& what) {
  const std::string n = name(rank, what);
  if (auto it = m_found.find(n); it != m_found.end()) return it->second;
  const auto deadline = Clock::now() + m_timeout;
  Backoff backoff;
  while (Clock::now() < deadline) {
    auto nodes = m_client.nodes();
    if (nodes.ok()) {
      for (const NodeInfo& node : *nodes) {
        if (node.state != NodeState::self && node.state != NodeState::connected) continue;
        auto a = m_client.lookup(n, node.state == NodeState::self ? NodeId{0} : node.node);
        if (a.ok()) {
          m_found[n] = a->gva;
          return a->gva;
        }
      }
    }
    backoff.pause();
  }
  return Status(ErrorCode::timeout, "rank " + std::to_string(rank) + " did not appear within " +
                                        std::to_string(m_timeout.count() / 1000) + " s (no allocation " + n +
                                        " on any node): is it running, with the same --job?");
}

namespace {

// The node holding the memory is down (its daemon crashed or restarts).
bool node_down(const Status& s) {
  const ErrorCode c = s.code();
  return c == ErrorCode::connection_failed || c == ErrorCode::connection_closed || c == ErrorCode::unavailable ||
         c == ErrorCode::transport_error;
}

}  // namespace

Status JobDirectory::while_down(const std::function<Status()>& op) {
  const auto deadline = Clock::now() + m_timeout;
  Backoff backoff;
  for (;;) {
    Status s = op();
    if (s.ok() || !node_down(s) || Clock::now() > deadline) return s;
    backoff.pause();
  }
}

Status JobDirectory::read(Gva at, void* dst, size_t length) {
  return while_down([&] { return m_client.read(at, dst, length); });
}

Status JobDirectory::write(Gva at, const void* src, size_t length) {
  return while_down([&] { return m_client.write(at, src, length); });
}

Status JobDirectory::raise(Gva word, uint64_t value) {
  // A compare-and-swap up to `value`: repeating one whose outcome a crash
  // hid is harmless (the word only ever goes up).
  return while_down([&]() -> Status {
    TIERMEM_ASSIGN_OR_RETURN(auto seen, m_client.compare_swap(word, 0, value));
    uint64_t current = seen;
    while (current < value) {
      TIERMEM_ASSIGN_OR_RETURN(auto r, m_client.compare_swap(word, current, value));
      if (r == current) break;
      current = r;
    }
    return Status();
  });
}

Result<uint64_t> JobDirectory::load(Gva word) {
  uint64_t v = 0;
  Status s = m_client.read(word, &v, sizeof v);
  if (!s.ok()) return s;
  return v;
}

Status JobDirectory::wait_at_least(Gva word, uint64_t value, const std::string& what) {
  const auto deadline = Clock::now() + m_timeout;
  Backoff backoff;
  for (;;) {
    auto v = load(word);
    if (!v.ok()) {
      // The node holding the word may be restarting (its daemon crashed
      // and comes back with its memory): wait for it like for the value.
      if (!node_down(v.status()) || Clock::now() > deadline) return v.status().with_context("waiting for " + what);
      backoff.pause();
      continue;
    }
    if (*v >= value) return Status();
    if (Clock::now() > deadline) {
      return Status(ErrorCode::timeout, "waited " + std::to_string(m_timeout.count() / 1000) + " s for " + what);
    }
    backoff.pause();
  }
}

Status wait_local(const uint64_t* word, uint64_t value, std::chrono::milliseconds timeout, const std::string& what) {
  const auto deadline = Clock::now() + timeout;
  Backoff backoff;
  while (load_local(word) < value) {
    if (Clock::now() > deadline) {
      return Status(ErrorCode::timeout, "waited " + std::to_string(timeout.count() / 1000) + " s for " + what);
    }
    backoff.pause();
  }
  return Status();
}

}  // namespace tiermem::exec
