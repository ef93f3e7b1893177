#include "daemon/leases.hpp"

#include <poll.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>

#include <spdlog/spdlog.h>

namespace tiermem {
namespace {

// Whether the process of `pidfd` has exited (a pidfd polls readable then).
bool exited(const UniqueFd& pidfd) {
  if (!pidfd.valid()) return true;
  pollfd p{.fd = pidfd.get(), .events = POLLIN, .revents = 0};
  return ::poll(&p, 1, 0) != 0;
}

// The same allocation (pins are kept by its base GVA; the generation a
// client sends may be 0, unchecked).
bool same(const Gva& a, const Gva& b) { return a.node == b.node && a.offset == b.offset; }

std::vector<Gva>::iterator find_same(std::vector<Gva>& v, const Gva& g) {
  return std::find_if(v.begin(), v.end(), [&](const Gva& x) { return same(x, g); });
}

void append(std::vector<Gva>& to, const std::vector<Gva>& from) { to.insert(to.end(), from.begin(), from.end()); }

}  // namespace

bool Leases::Process::pinned(const Gva& g) const {
  for (const auto& [client, list] : pins) {
    if (std::any_of(list.begin(), list.end(), [&](const Gva& x) { return same(x, g); })) return true;
  }
  return false;
}

bool Leases::Process::empty() const {
  return ended.empty() && std::all_of(pins.begin(), pins.end(), [](const auto& p) { return p.second.empty(); });
}

Leases::Process& Leases::record(const ClientKey& key) {
  auto [it, fresh] = m_processes.try_emplace({key.pid, key.uid});
  if (fresh && key.pid > 0) it->second.pidfd.reset(static_cast<int>(::syscall(SYS_pidfd_open, key.pid, 0)));
  return it->second;
}

void Leases::pin(const ClientKey& key, Gva gva) {
  std::lock_guard lock(m_mutex);
  record(key).pins[key.client].push_back(gva);
}

std::optional<Gva> Leases::unpin(const ClientKey& key, Gva gva) {
  std::lock_guard lock(m_mutex);
  auto p = m_processes.find({key.pid, key.uid});
  if (p == m_processes.end()) return std::nullopt;
  auto c = p->second.pins.find(key.client);
  if (c == p->second.pins.end()) return std::nullopt;
  auto it = find_same(c->second, gva);
  if (it == c->second.end()) return std::nullopt;
  const Gva pinned = *it;
  c->second.erase(it);
  if (c->second.empty()) p->second.pins.erase(c);
  if (p->second.empty()) m_processes.erase(p);
  return pinned;
}

Leases::Held Leases::end_session(const ClientKey& key, uint64_t session, std::vector<Gva> owned) {
  Held now;
  std::lock_guard lock(m_mutex);
  if (owned.empty() && m_processes.count({key.pid, key.uid}) == 0) return now;
  Process& process = record(key);
  const auto p = m_processes.find({key.pid, key.uid});
  if (exited(process.pidfd)) {
    // Gone: nothing of it can come back.
    now.owned = std::move(owned);
    for (const Ended& e : process.ended) append(now.owned, e.owned);
    for (const auto& [client, list] : process.pins) append(now.pins, list);
    m_processes.erase(p);
    return now;
  }
  if (m_grace.count() <= 0) {
    // No grace: what no pin of the process holds goes now.
    auto held = std::stable_partition(owned.begin(), owned.end(), [&](const Gva& g) { return process.pinned(g); });
    now.owned.assign(held, owned.end());
    owned.erase(held, owned.end());
  }
  auto pins = process.pins.find(key.client);
  const size_t mappings = pins == process.pins.end() ? 0 : pins->second.size();
  if (!owned.empty() || mappings > 0) {
    spdlog::info("session {} of pid {} ended holding {} session allocation(s) and {} mapping(s): allocations kept {} ms "
                 "for that process to connect again (lease.grace_ms), mappings while it lives",
                 session, key.pid, owned.size(), mappings, m_grace.count());
  }
  if (!owned.empty()) process.ended.push_back({session, std::chrono::steady_clock::now() + m_grace, std::move(owned)});
  if (process.empty()) m_processes.erase(p);
  return now;
}

Leases::Held Leases::begin_session(const ClientKey& key, const std::vector<Gva>& mapped, std::vector<Gva>* owned,
                                   std::vector<bool>* kept) {
  Held let_go;
  kept->assign(mapped.size(), false);
  std::lock_guard lock(m_mutex);
  auto p = m_processes.find({key.pid, key.uid});
  if (p == m_processes.end()) return let_go;
  Process& process = p->second;
  if (exited(process.pidfd)) return let_go;  // a reused pid: expired() lets the old one's go
  for (const Ended& e : process.ended) append(*owned, e.owned);
  process.ended.clear();
  // Each mapping the client says it has claims one kept pin of its
  // allocation; the pins left are of mappings it no longer has.
  auto c = process.pins.find(key.client);
  if (c != process.pins.end()) {
    std::vector<Gva> unclaimed = std::move(c->second);
    c->second.clear();
    for (size_t i = 0; i < mapped.size(); ++i) {
      auto it = find_same(unclaimed, mapped[i]);
      if (it == unclaimed.end()) continue;
      (*kept)[i] = true;
      c->second.push_back(*it);
      unclaimed.erase(it);
    }
    let_go.pins = std::move(unclaimed);
    if (c->second.empty()) process.pins.erase(c);
  }
  if (process.empty()) m_processes.erase(p);
  return let_go;
}

Leases::Held Leases::expired() {
  Held out;
  const auto now = std::chrono::steady_clock::now();
  std::lock_guard lock(m_mutex);
  for (auto p = m_processes.begin(); p != m_processes.end();) {
    Process& process = p->second;
    if (exited(process.pidfd)) {
      const size_t owned_before = out.owned.size(), pins_before = out.pins.size();
      for (const Ended& e : process.ended) append(out.owned, e.owned);
      for (const auto& [client, list] : process.pins) append(out.pins, list);
      if (out.owned.size() > owned_before || out.pins.size() > pins_before) {
        spdlog::info("pid {} exited: freeing its {} session allocation(s), unpinning {} mapping(s)", p->first.first,
                     out.owned.size() - owned_before, out.pins.size() - pins_before);
      }
      p = m_processes.erase(p);
      continue;
    }
    for (Ended& e : process.ended) {
      if (now < e.until) continue;
      // Past its grace: freed, but what a pin of the process still holds.
      auto held = std::stable_partition(e.owned.begin(), e.owned.end(), [&](const Gva& g) { return process.pinned(g); });
      if (held != e.owned.end()) {
        spdlog::info("the lease of session {} (pid {}) ended: freeing {} session allocation(s)", e.session,
                     p->first.first, static_cast<size_t>(e.owned.end() - held));
      }
      out.owned.insert(out.owned.end(), held, e.owned.end());
      e.owned.erase(held, e.owned.end());
    }
    std::erase_if(process.ended, [](const Ended& e) { return e.owned.empty(); });
    if (process.empty()) {
      p = m_processes.erase(p);
    } else {
      ++p;
    }
  }
  return out;
}

size_t Leases::pins() const {
  std::lock_guard lock(m_mutex);
  size_t n = 0;
  for (const auto& [key, process] : m_processes) {
    for (const auto& [client, list] : process.pins) n += list.size();
  }
  return n;
}

}  // namespace tiermem
