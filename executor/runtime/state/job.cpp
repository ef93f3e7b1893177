#include "executor/runtime/state/job.hpp"

#include <algorithm>
#include <cctype>
#include <cstdio>
#include <thread>

#include <tiermem/status_macros.h>

namespace tiermem::exec {
namespace {

using Clock = std::chrono::steady_clock;

// Spin, yield, then sleep a little longer each time (up to 1 ms).
// Spins a little, yields, then sleeps up to `max_sleep_us` between looks.
class Backoff {
 public:
  explicit Backoff(int64_t max_sleep_us = 1000) : m_max_sleep_us(max_sleep_us) {}
  void pause() {
    if (++m_rounds < 64) return;
    if (m_rounds < 256) {
      std::this_thread::yield();
      return;
    }
    std::this_thread::sleep_for(std::chrono::microseconds(std::min<int64_t>(m_max_sleep_us, m_rounds - 250)));
  }

 private:
  int64_t m_max_sleep_us;
  int64_t m_rounds = 0;
};

// A word of this process's memory costs nothing to look at: waits on one
// sleep at most this long between looks (a boundary message is seen within
// it), without spinning a core.
constexpr int64_t k_local_wait_sleep_us = 100;

}  // namespace

namespace {
// What every generation of the plan shares.
bool shared_by_generations(const std::string& what) { return what == "profile"; }
}  // namespace

std::string JobDirectory::name(int rank, const std::string& what) const {
  const std::string base = m_job + ".r" + std::to_string(rank) + ".";
  if (m_generation == 0 || shared_by_generations(what)) return base + what;
  return base + "g" + std::to_string(m_generation) + "." + what;
}

int64_t JobDirectory::generation_of(int rank, const std::string& name) const {
  const std::string base = m_job + ".r" + std::to_string(rank) + ".";
  if (name.rfind(base, 0) != 0) return -1;
  const std::string what = name.substr(base.size());
  if (shared_by_generations(what)) return -1;
  if (what.size() > 1 && what[0] == 'g' && std::isdigit(static_cast<unsigned char>(what[1]))) {
    const size_t dot = what.find('.');
    if (dot != std::string::npos) return std::stoll(what.substr(1, dot - 1));
  }
  return 0;
}

Result<OwnRegion> JobDirectory::own(const std::string& what, uint64_t size, AllocOptions options, bool map) {
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
  if (!map) return region;
  auto m = m_client.map(region.gva);
  if (!m.ok()) return m.status().with_context("mapping " + n);
  region.mapping = std::move(m).value();
  return region;
}

Result<Gva> JobDirectory::find(const std::string& name) {
  TIERMEM_ASSIGN_OR_RETURN(auto nodes, m_client.nodes());
  for (const NodeInfo& node : nodes) {
    if (node.state != NodeState::self && node.state != NodeState::connected) continue;
    auto a = m_client.lookup(name, node.state == NodeState::self ? NodeId{0} : node.node);
    if (a.ok()) return a->gva;
  }
  return Status(ErrorCode::not_found, "no allocation " + name + " on a reachable node");
}

Result<Gva> JobDirectory::peer(int rank, const std::string& what) {
  const std::string n = name(rank, what);
  if (auto it = m_found.find(n); it != m_found.end()) return it->second;
  const auto deadline = Clock::now() + m_timeout;
  Backoff backoff;
  while (Clock::now() < deadline) {
    if (auto gva = find(n); gva.ok()) {
      m_found[n] = *gva;
      return *gva;
    }
    backoff.pause();
  }
  return Status(ErrorCode::timeout, "rank " + std::to_string(rank) + " did not appear within " +
                                        std::to_string(m_timeout.count() / 1000) + " s (no allocation " + n +
                                        " on any node): is it running, with the same --job?");
}

std::vector<Gva> JobDirectory::elsewhere(const std::string& what, Gva mine) {
  const std::string n = name(m_rank, what);
  std::vector<Gva> out;
  auto add = [&](Gva g) {
    if (g == mine || std::find(out.begin(), out.end(), g) != out.end()) return;
    out.push_back(g);
  };
  auto nodes = m_client.nodes();
  if (!nodes.ok()) return out;
  for (const NodeInfo& node : *nodes) {
    if (node.state != NodeState::self && node.state != NodeState::connected) continue;
    const NodeId id = node.state == NodeState::self ? NodeId{0} : node.node;
    if (auto a = m_client.lookup(n, id); a.ok()) add(a->gva);
    // Copies carry their home's name; the home may be the node that died.
    if (auto list = m_client.list(id); list.ok()) {
      for (const AllocationInfo& a : *list) {
        if (a.replica_of.node != 0 && a.name == n) add(a.replica_of);
      }
    }
  }
  return out;
}

namespace {

// The node holding the memory is down (its daemon crashed or restarts).
bool node_down(const Status& s) {
  const ErrorCode c = s.code();
  return c == ErrorCode::connection_failed || c == ErrorCode::connection_closed || c == ErrorCode::unavailable ||
         c == ErrorCode::transport_error;
}

// An access that failed this way may have gone to a peer allocation that is
// gone (its node died, or came back without it).
bool maybe_moved(const Status& s) {
  const ErrorCode c = s.code();
  return node_down(s) || c == ErrorCode::not_found || c == ErrorCode::not_allocated ||
         c == ErrorCode::stale_generation || c == ErrorCode::timeout;
}

}  // namespace

Gva JobDirectory::current(Gva at) const {
  auto it = m_moved.find({at.node, at.generation});
  if (it == m_moved.end()) return at;
  const auto& [old_base, now] = it->second;
  return now.plus(at.offset - old_base.offset);
}

bool JobDirectory::follow(Gva at, const Status& s) {
  if (!maybe_moved(s)) return false;
  // A lookup on every node is not free: at most every 10 ms (it is made
  // only while a peer's memory fails, and a moved rank is waited for).
  if (Clock::now() - m_last_follow < std::chrono::milliseconds(10)) return false;
  m_last_follow = Clock::now();
  std::string moved_name;
  for (auto& [n, gva] : m_found) {
    if (gva.node != at.node || gva.generation != at.generation) continue;
    if (!move_to_fresh(n, gva, s)) return false;
    moved_name = n;
    break;
  }
  if (moved_name.empty()) return false;
  // The rank's other allocations on that node went with it (a replacement
  // makes all of them before it goes on): followed now, not each after its
  // own failure and the wait between lookups.
  const std::string rank_prefix = moved_name.substr(0, moved_name.rfind('.') + 1);
  for (auto& [n, gva] : m_found) {
    if (n != moved_name && n.compare(0, rank_prefix.size(), rank_prefix) == 0 && gva.node == at.node &&
        m_moved.count({gva.node, gva.generation}) == 0) {
      (void)move_to_fresh(n, gva, s);
    }
  }
  return true;
}

bool JobDirectory::move_to_fresh(const std::string& name, Gva& gva, const Status& why) {
  auto fresh = find(name);
  if (!fresh.ok() || *fresh == gva) return false;
  std::fprintf(stderr, "rank %d: %s moved from %s to %s (%s); following it\n", m_rank, name.c_str(),
               gva.to_string().c_str(), fresh->to_string().c_str(), why.to_string().c_str());
  for (auto& [key, moved] : m_moved) {
    if (moved.second == gva) moved.second = *fresh;  // moved again
  }
  m_moved[{gva.node, gva.generation}] = {gva, *fresh};
  gva = *fresh;
  ++m_moves;
  return true;
}

Status JobDirectory::on_peer(Gva at, const std::function<Status(Gva)>& op) {
  const auto deadline = Clock::now() + m_timeout;
  Backoff backoff;
  for (;;) {
    const Gva now = current(at);
    Status s = op(now);
    if (s.ok() || follow(now, s)) {
      if (s.ok()) return s;
      continue;
    }
    if (!node_down(s) || Clock::now() > deadline) return s;
    backoff.pause();
  }
}

Status JobDirectory::read(Gva at, void* dst, size_t length) {
  return on_peer(at, [&](Gva g) { return m_client.read(g, dst, length); });
}

Status JobDirectory::write(Gva at, const void* src, size_t length) {
  return on_peer(at, [&](Gva g) { return m_client.write(g, src, length); });
}

Status JobDirectory::raise(Gva word, uint64_t value) {
  // A compare-and-swap up to `value`: repeating one whose outcome a crash
  // hid is harmless (the word only ever goes up).
  return on_peer(word, [&](Gva g) -> Status {
    TIERMEM_ASSIGN_OR_RETURN(auto seen, m_client.compare_swap(g, 0, value));
    uint64_t now = seen;
    while (now < value) {
      TIERMEM_ASSIGN_OR_RETURN(auto r, m_client.compare_swap(g, now, value));
      if (r == now) break;
      now = r;
    }
    return Status();
  });
}

Result<uint64_t> JobDirectory::load(Gva word) {
  uint64_t v = 0;
  Status s = m_client.read(current(word), &v, sizeof v);
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
      // and comes back with its memory), or its rank was replaced on
      // another node: wait for it like for the value, or follow it.
      if (follow(current(word), v.status())) continue;
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
  Backoff backoff(k_local_wait_sleep_us);
  while (load_local(word) < value) {
    if (Clock::now() > deadline) {
      return Status(ErrorCode::timeout, "waited " + std::to_string(timeout.count() / 1000) + " s for " + what);
    }
    backoff.pause();
  }
  return Status();
}

}  // namespace tiermem::exec
