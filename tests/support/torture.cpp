// torture: a crash test of durability (H5). Starts a real tiermemd on its own
// directories, preloads it with named allocations, starts worker processes
// that make random operations through libtiermem (alloc, write, free,
// migrate between DRAM and PMEM, lookup by name), and SIGKILLs the daemon N
// times at random moments, starting it again each time on the same pool and
// shared memory. The workers are not restarted: their Client connects again
// by itself.
//
// Each worker logs an operation once it was acknowledged; one whose outcome
// the crash hid (unavailable: "may or may not have taken effect") is
// resolved by looking its allocation up by name after the reconnect. At the
// end, with the workers stopped, every acknowledged operation is checked
// against what the daemon serves:
//   - an allocation acknowledged and not freed is found by name at the same
//     GVA and holds the bytes of its last acknowledged write (lost, mismatched);
//   - a freed one is not found by name, and its GVA does not read (ghosts);
//   - no allocation of a worker exists that the logs do not know (ghosts);
// and the metadata pool passes `pmempool check` after a clean stop.
//
//   torture [--kills N] [--workers W] [--preload P] [--seed S] [--min-ms A] [--max-ms B]
//
// Prints `name value [unit]` lines: kills, acknowledged_ops,
// acknowledged_ops_lost, bytes_mismatched, ghosts, allocations_at_a_reused_gva,
// restart_ms_p50/p99 (a SIGKILLed daemon's start to serving, P allocations
// recorded),
// recovery_ms_per_1000_records, pool_check_ok. Exit status 1 when anything
// was lost, mismatched or came back, or the pool check failed.
#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <csignal>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <tiermem/client.h>

#include "tests/support/test_daemon.hpp"

namespace {

using namespace tiermem;
using Clock = std::chrono::steady_clock;

constexpr uint64_t k_page = 4096;

struct Options {
  int kills = 100;
  int workers = 3;
  int preload = 200;
  unsigned seed = 1;
  int min_ms = 30;
  int max_ms = 250;
};

volatile sig_atomic_t g_stop = 0;
void on_term(int) { g_stop = 1; }

// The bytes a write with `seed` puts into an allocation of `size` (seed 0:
// none yet, zeros).
std::vector<unsigned char> content(uint64_t size, unsigned seed) {
  if (seed == 0) return std::vector<unsigned char>(size, 0);
  return test::pattern(size, seed);
}

class Log {
 public:
  explicit Log(const std::string& path) : m_fd(::open(path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644)) {}
  ~Log() { ::close(m_fd); }
  void line(const std::string& s) {
    const std::string l = s + "\n";
    (void)::write(m_fd, l.data(), l.size());
  }

 private:
  int m_fd;
};

struct Owned {
  std::string name;
  Gva gva;
  uint64_t size = 0;
  Tier tier = Tier::dram;
};

bool maybe(const Status& s) { return s.code() == ErrorCode::unavailable; }

// One worker process: random operations until SIGTERM.
int worker(const std::string& socket, const std::string& log_path, int id, unsigned seed) {
  std::signal(SIGTERM, on_term);
  ClientOptions o;
  o.socket_path = socket;
  o.client_name = "torture-" + std::to_string(id);
  o.reconnect_timeout = std::chrono::seconds(60);
  auto client = Client::connect(o);
  if (!client.ok()) {
    std::fprintf(stderr, "worker %d: %s\n", id, client.status().to_string().c_str());
    return 1;
  }
  Client& c = **client;
  Log log(log_path);
  std::mt19937 rng(seed);
  std::vector<Owned> owned;
  uint64_t made = 0;
  const auto pick = [&] { return std::uniform_int_distribution<size_t>(0, owned.size() - 1)(rng); };
  while (g_stop == 0) {
    int r = static_cast<int>(rng() % 100);
    if (owned.size() > 150) r = 70 + static_cast<int>(rng() % 15);  // enough: free some
    if (r < 30 || owned.empty()) {
      Owned a;
      a.name = "w" + std::to_string(id) + "-" + std::to_string(made++);
      a.size = (1 + rng() % 3) * k_page - rng() % 100;
      a.tier = rng() % 2 == 0 ? Tier::dram : Tier::pmem;
      auto info = c.alloc(a.size, {.tier = a.tier, .name = a.name});
      if (!info.ok() && maybe(info.status())) info = c.lookup(a.name);  // did it happen?
      if (!info.ok()) continue;
      a.gva = info->gva;
      log.line("A " + a.name + " " + a.gva.to_string() + " " + std::to_string(a.size));
      owned.push_back(a);
    } else if (r < 70) {
      const Owned& a = owned[pick()];
      const unsigned s = 1 + rng() % 1000000;
      const auto bytes = content(a.size, s);
      Status st = c.write(a.gva, bytes.data(), bytes.size());
      if (st.ok()) {
        log.line("W " + a.gva.to_string() + " " + std::to_string(s));
      } else {
        log.line("U " + a.gva.to_string());  // what it holds now is not known
      }
    } else if (r < 85) {
      const size_t i = pick();
      Status st = c.free(owned[i].gva);
      if (!st.ok() && maybe(st)) {
        auto found = c.lookup(owned[i].name);
        if (!found.ok() && found.status().code() == ErrorCode::not_found) st = Status();
      }
      if (st.ok()) {
        log.line("F " + owned[i].gva.to_string());
        owned.erase(owned.begin() + static_cast<long>(i));
      }
    } else {
      Owned& a = owned[pick()];
      const Tier to = a.tier == Tier::dram ? Tier::pmem : Tier::dram;
      if (c.migrate(a.gva, to).ok()) {
        a.tier = to;
        log.line("M " + a.gva.to_string() + " " + std::string(tier_name(to)));
      }
    }
  }
  return 0;
}

struct Expected {
  std::string gva;
  uint64_t size = 0;
  unsigned seed = 0;     // of the last acknowledged write (0: zeros)
  bool known = true;     // false: a write failed, its bytes may be there or not
  bool freed = false;
};

struct Tally {
  uint64_t acknowledged = 0, lost = 0, mismatched = 0, ghosts = 0, unknown_content = 0;
  uint64_t gvas_reused = 0;  // A lines at a GVA an earlier allocation (any worker's) had
};

// Replays the workers' logs into what the daemon must serve, by allocation
// name. A log names an allocation by its GVA after the A line; that GVA is
// resolved within the worker's own log, whose lines are in the order they
// happened. Across workers they are not: a GVA one worker freed can be another
// worker's next allocation, so the model is not keyed by GVA.
std::map<std::string, Expected> replay(const std::vector<std::string>& logs, Tally* t) {
  std::map<std::string, Expected> by_name;
  std::map<std::string, int> allocated_at;  // GVA -> A lines there, all workers
  for (const std::string& path : logs) {
    std::map<std::string, std::string> name_at;  // this worker's live GVAs
    std::ifstream in(path);
    std::string line;
    while (std::getline(in, line)) {
      std::istringstream f(line);
      std::string op, a, b, c;
      f >> op >> a >> b >> c;
      if (op == "A") {
        by_name[a] = Expected{b, std::stoull(c), 0, true, false};
        name_at[b] = a;
        if (allocated_at[b]++ > 0) ++t->gvas_reused;
        ++t->acknowledged;
        continue;
      }
      const auto at = name_at.find(a);
      if (at == name_at.end()) {
        std::fprintf(stderr, "torture: %s: '%s' names no live allocation of its worker\n", path.c_str(), line.c_str());
        ++t->lost;
        continue;
      }
      Expected& e = by_name[at->second];
      if (op == "W") {
        e.seed = static_cast<unsigned>(std::stoul(b));
        e.known = true;
        ++t->acknowledged;
      } else if (op == "U") {
        e.known = false;
      } else if (op == "F") {
        e.freed = true;
        name_at.erase(at);
        ++t->acknowledged;
      } else if (op == "M") {
        ++t->acknowledged;
      }
    }
  }
  return by_name;
}

void check(Client& c, const std::map<std::string, Expected>& model, Tally* t) {
  std::map<std::string, std::string> live;  // GVA -> name of what must be there
  for (const auto& [name, e] : model) {
    if (e.freed) continue;
    if (const auto [at, fresh] = live.emplace(e.gva, name); !fresh) {
      ++t->lost;  // two acknowledged allocations at one GVA: one of them is not there
      std::fprintf(stderr, "torture: %s and %s were both given %s and neither was freed\n", at->second.c_str(),
                   name.c_str(), e.gva.c_str());
    }
  }
  for (const auto& [name, e] : model) {
    const Gva gva = *Gva::parse(e.gva);
    auto found = c.lookup(name);
    std::vector<unsigned char> got(e.size);
    const Status read = c.read(gva, got.data(), got.size());
    if (e.freed) {
      // Its name must be gone; its GVA may read only as another live allocation.
      if (found.ok() || (read.ok() && live.count(e.gva) == 0)) {
        ++t->ghosts;
        std::fprintf(stderr, "torture: freed %s (%s) came back\n", name.c_str(), e.gva.c_str());
      }
      continue;
    }
    if (!found.ok() || found->gva.to_string() != e.gva || !read.ok()) {
      ++t->lost;
      std::fprintf(stderr, "torture: %s (%s) lost: %s / %s\n", name.c_str(), e.gva.c_str(),
                   found.ok() ? found->gva.to_string().c_str() : found.status().to_string().c_str(),
                   read.to_string().c_str());
      continue;
    }
    if (!e.known) {
      ++t->unknown_content;
    } else if (got != content(e.size, e.seed)) {
      ++t->mismatched;
      std::fprintf(stderr, "torture: %s (%s) does not hold its last acknowledged write (seed %u)\n", name.c_str(),
                   e.gva.c_str(), e.seed);
    }
  }
  // Nothing of the workers' that the logs do not know of.
  auto all = c.list();
  if (!all.ok()) return;
  for (const AllocationInfo& a : *all) {
    const auto l = live.find(a.gva.to_string());
    if (a.name.rfind("w", 0) == 0 && (l == live.end() || l->second != a.name)) {
      ++t->ghosts;
      std::fprintf(stderr, "torture: %s (%s) is unknown to the logs\n", a.name.c_str(), a.gva.to_string().c_str());
    }
  }
}

double percentile(std::vector<double> v, double p) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[static_cast<size_t>(p * static_cast<double>(v.size() - 1) + 0.5)];
}

int run(const Options& o) {
  test::DaemonOptions d;
  d.page_size = "4KiB";
  d.dram = "96MiB";
  d.pmem = "96MiB";
  d.extra_toml = "[recovery]\nstale_writer_grace_ms = 200\n";
  test::TestDaemon daemon(d);
  if (!daemon.ready()) {
    std::fprintf(stderr, "torture: the daemon did not start:\n%s\n", daemon.log().c_str());
    return 1;
  }
  {
    auto c = daemon.connect("torture-preload");
    for (int i = 0; c && i < o.preload; ++i) {
      auto a = c->alloc(k_page, {.tier = i % 2 == 0 ? Tier::dram : Tier::pmem, .name = "preload-" + std::to_string(i)});
      if (!a.ok()) {
        std::fprintf(stderr, "torture: preload %d: %s\n", i, a.status().to_string().c_str());
        return 1;
      }
    }
  }
  std::vector<std::string> logs;
  std::vector<pid_t> workers;
  for (int w = 0; w < o.workers; ++w) {
    logs.push_back(daemon.dir() + "/worker-" + std::to_string(w) + ".log");
    const pid_t pid = ::fork();
    if (pid == 0) ::_exit(worker(daemon.socket(), logs.back(), w, o.seed * 7919 + static_cast<unsigned>(w)));
    workers.push_back(pid);
  }
  std::mt19937 rng(o.seed);
  std::vector<double> restart_ms, per_1000;
  for (int k = 0; k < o.kills; ++k) {
    std::this_thread::sleep_for(std::chrono::milliseconds(std::uniform_int_distribution<int>(o.min_ms, o.max_ms)(rng)));
    daemon.kill();
    const auto t0 = Clock::now();
    if (!daemon.restart()) {
      std::fprintf(stderr, "torture: restart %d failed:\n%s\n", k + 1, daemon.log().c_str());
      for (pid_t p : workers) ::kill(p, SIGKILL);
      return 1;
    }
    restart_ms.push_back(std::chrono::duration<double, std::milli>(Clock::now() - t0).count());
    if (auto c = daemon.connect("torture-stat")) {
      if (auto s = c->stat(); s.ok() && s->recovery.allocations > 0) {
        per_1000.push_back(s->recovery.elapsed_ms * 1000.0 / static_cast<double>(s->recovery.allocations));
      }
    }
    if ((k + 1) % 50 == 0) std::fprintf(stderr, "torture: %d of %d kills\n", k + 1, o.kills);
  }
  for (pid_t p : workers) ::kill(p, SIGTERM);
  for (pid_t p : workers) ::waitpid(p, nullptr, 0);

  Tally t;
  const auto model = replay(logs, &t);
  {
    auto c = daemon.connect("torture-check");
    if (!c) {
      std::fprintf(stderr, "torture: cannot connect to check\n");
      return 1;
    }
    check(*c, model, &t);
  }
  const int rc = daemon.stop();
  const auto pool = test::run_command({"pmempool", "check", daemon.pmem_dir() + "/metadata.pool"});
  const bool pool_ok = pool.exit_code == 0;
  if (!pool_ok) std::fprintf(stderr, "torture: pmempool check: %s%s\n", pool.out.c_str(), pool.err.c_str());
  std::printf("kills %d\n", o.kills);
  std::printf("workers %d\n", o.workers);
  std::printf("preloaded_allocations %d\n", o.preload);
  std::printf("acknowledged_ops %llu\n", static_cast<unsigned long long>(t.acknowledged));
  std::printf("acknowledged_ops_lost %llu\n", static_cast<unsigned long long>(t.lost));
  std::printf("bytes_mismatched %llu\n", static_cast<unsigned long long>(t.mismatched));
  std::printf("ghosts %llu\n", static_cast<unsigned long long>(t.ghosts));
  std::printf("allocations_at_a_reused_gva %llu\n", static_cast<unsigned long long>(t.gvas_reused));
  std::printf("allocations_with_unknown_content %llu\n", static_cast<unsigned long long>(t.unknown_content));
  std::printf("restart_ms_p50 %.1f ms\n", percentile(restart_ms, 0.5));
  std::printf("restart_ms_p99 %.1f ms\n", percentile(restart_ms, 0.99));
  std::printf("recovery_ms_per_1000_records %.2f ms\n", percentile(per_1000, 0.5));
  std::printf("pool_check_ok %d\n", pool_ok ? 1 : 0);
  std::printf("clean_stop_rc %d\n", rc);
  return t.lost == 0 && t.mismatched == 0 && t.ghosts == 0 && pool_ok ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string a = argv[i];
    const int v = std::atoi(argv[i + 1]);
    if (a == "--kills") o.kills = v;
    else if (a == "--workers") o.workers = v;
    else if (a == "--preload") o.preload = v;
    else if (a == "--seed") o.seed = static_cast<unsigned>(v);
    else if (a == "--min-ms") o.min_ms = v;
    else if (a == "--max-ms") o.max_ms = v;
    else {
      std::fprintf(stderr, "usage: torture [--kills N] [--workers W] [--preload P] [--seed S] [--min-ms A] [--max-ms B]\n");
      return 2;
    }
  }
  return run(o);
}
