#include "executor/cuda/nccl_collective.hpp"

#include <algorithm>
#include <cstring>
#include <thread>

#include <tiermem/status_macros.h>

#if TIERMEM_HAVE_NCCL
#include <dlfcn.h>
#include <nccl.h>

#include <type_traits>
#endif

namespace tiermem::exec::nccl {

#if TIERMEM_HAVE_NCCL

// libnccl.so.2, loaded when a group is first wanted (not linked: the plugin
// then runs where NCCL is not installed, and says so only when asked for
// collectives). nccl.h gives the types.
// The functions called, each as lib().Name (ncclName).
#define TIERMEM_NCCL_FUNCTIONS(X) X(GetVersion) X(GetUniqueId) X(CommInitRankConfig) X(CommGetAsyncError) X(CommFinalize) X(CommDestroy) X(CommAbort) X(AllReduce) X(GetErrorString) X(GetLastError)

struct Library {
#define TIERMEM_NCCL_POINTER(name) decltype(&nccl##name) name = nullptr;
  TIERMEM_NCCL_FUNCTIONS(TIERMEM_NCCL_POINTER)
#undef TIERMEM_NCCL_POINTER
  std::string error;  // why it could not be loaded
};

const Library& lib() {
  static const Library loaded = [] {
    Library l;
    void* h = ::dlopen("libnccl.so.2", RTLD_NOW | RTLD_LOCAL);
    if (h == nullptr) {
      const char* e = ::dlerror();
      l.error = std::string("cannot load libnccl.so.2 (NCCL): ") + (e != nullptr ? e : "not found");
      return l;
    }
    bool ok = true;
    auto find = [&](auto& fn, const char* name) {
      fn = reinterpret_cast<std::remove_reference_t<decltype(fn)>>(::dlsym(h, name));
      ok = ok && fn != nullptr;
    };
#define TIERMEM_NCCL_FIND(name) find(l.name, "nccl" #name);
    TIERMEM_NCCL_FUNCTIONS(TIERMEM_NCCL_FIND)
#undef TIERMEM_NCCL_FIND
    if (!ok) l.error = "libnccl.so.2 lacks a function this build needs (NCCL older than 2.18?)";
    return l;
  }();
  return loaded;
}

class Group final : public Collective {
 public:
  Group(Registry& registry, cudaStream_t compute, int size, int rank, std::chrono::milliseconds timeout)
      : m_registry(registry), m_compute(compute), m_size(size), m_rank(rank), m_timeout(timeout) {}

  ~Group() override {
    m_registry.remove(this);
    if (m_comm != nullptr) {
      // A made group that is idle is finalised (its peers do the same); one
      // that failed or is still joining is aborted.
      if (m_made && m_error.empty() && stream_idle()) {
        ncclResult_t r = lib().CommFinalize(m_comm);
        const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
        ncclResult_t state = ncclInProgress;
        while (r == ncclSuccess || r == ncclInProgress) {
          if (lib().CommGetAsyncError(m_comm, &state) != ncclSuccess || state != ncclInProgress) break;
          if (std::chrono::steady_clock::now() > deadline) break;
          std::this_thread::sleep_for(std::chrono::milliseconds(1));
        }
        if ((r == ncclSuccess || r == ncclInProgress) && state == ncclSuccess) {
          lib().CommDestroy(m_comm);
        } else {
          lib().CommAbort(m_comm);
        }
      } else {
        lib().CommAbort(m_comm);
      }
    }
    for (auto& t : m_tickets) {
      for (cudaEvent_t e : {t.after, t.start, t.done}) {
        if (e != nullptr) cudaEventDestroy(e);
      }
    }
    if (m_side != nullptr) cudaStreamDestroy(m_side);
    if (m_words != nullptr) cudaFree(m_words);
    if (m_words_host != nullptr) cudaFreeHost(m_words_host);
  }

  std::string start(const std::string& id) {
    if (id.size() != sizeof(ncclUniqueId)) {
      return "an NCCL id is " + std::to_string(sizeof(ncclUniqueId)) + " bytes, not " + std::to_string(id.size());
    }
    ncclUniqueId uid;
    std::memcpy(&uid, id.data(), sizeof uid);
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0;
    ncclResult_t r = lib().CommInitRankConfig(&m_comm, m_size, uid, m_rank, &config);
    if (r != ncclSuccess && r != ncclInProgress) return describe("ncclCommInitRankConfig", r);
    if (cudaError_t e = cudaStreamCreateWithFlags(&m_side, cudaStreamNonBlocking); e != cudaSuccess) {
      return std::string("cudaStreamCreate (collectives): ") + cudaGetErrorString(e);
    }
    m_tickets.resize(k_ring);
    for (auto& t : m_tickets) {
      if (cudaEventCreateWithFlags(&t.after, cudaEventDisableTiming) != cudaSuccess ||
          cudaEventCreate(&t.start) != cudaSuccess || cudaEventCreate(&t.done) != cudaSuccess) {
        return "cannot create CUDA events for the collectives";
      }
    }
    if (cudaMalloc(&m_words, k_max_words * 8) != cudaSuccess ||
        cudaHostAlloc(&m_words_host, k_max_words * 8, cudaHostAllocPortable) != cudaSuccess) {
      return "out of memory for the collectives' words";
    }
    m_registry.add(this);
    return std::string();
  }

  int size() const override { return m_size; }
  int rank() const override { return m_rank; }

  Result<bool> joined() override {
    if (m_made) return true;
    if (!m_error.empty()) return Status(ErrorCode::io_error, m_error);
    ncclResult_t state = ncclInProgress;
    ncclResult_t r = lib().CommGetAsyncError(m_comm, &state);
    if (r != ncclSuccess) state = r;
    if (state == ncclInProgress) return false;
    if (state != ncclSuccess) {
      fail(describe("joining the group", state));
      return Status(ErrorCode::io_error, m_error);
    }
    m_made = true;
    return true;
  }

  void abort() override {
    if (m_comm != nullptr) lib().CommAbort(m_comm);
    m_comm = nullptr;
    fail("the group was aborted");
  }

  void all_reduce(const float* in, float* out, int64_t count) override {
    if (!usable()) return;
    call("ncclAllReduce", lib().AllReduce(in, out, static_cast<size_t>(count), ncclFloat32, ncclSum, m_comm, m_compute));
  }

  uint64_t all_reduce_beside(float* data, int64_t count) override {
    if (!usable() || count == 0) return m_issued;
    const uint64_t ticket = ++m_issued;
    Ticket& t = m_tickets[ticket % k_ring];
    if (t.pending) collect(t);  // k_ring tickets ago: long done, or waited for here
    cudaEventRecord(t.after, m_compute);
    cudaStreamWaitEvent(m_side, t.after, 0);
    cudaEventRecord(t.start, m_side);
    call("ncclAllReduce", lib().AllReduce(data, data, static_cast<size_t>(count), ncclFloat32, ncclSum, m_comm, m_side));
    cudaEventRecord(t.done, m_side);
    t.pending = true;
    t.bytes = static_cast<uint64_t>(count) * 4;
    return ticket;
  }

  void wait_beside(uint64_t ticket) override {
    if (ticket == 0 || ticket <= m_waited || ticket > m_issued) return;
    // A ticket whose slot was used again by a later one is waited for with
    // that one: longer, never shorter (one stream, in order).
    cudaStreamWaitEvent(m_compute, m_tickets[ticket % k_ring].done, 0);
    m_waited = ticket;
  }

  Result<std::vector<uint64_t>> sum_words(const std::vector<uint64_t>& mine) override {
    if (mine.size() > k_max_words) {
      return Status(ErrorCode::invalid_argument, "at most " + std::to_string(k_max_words) + " words at a time");
    }
    if (!usable()) return Status(ErrorCode::io_error, m_error.empty() ? "the group is not made yet" : m_error);
    std::memcpy(m_words_host, mine.data(), mine.size() * 8);
    cudaMemcpyAsync(m_words, m_words_host, mine.size() * 8, cudaMemcpyHostToDevice, m_compute);
    call("ncclAllReduce", lib().AllReduce(m_words, m_words, mine.size(), ncclUint64, ncclSum, m_comm, m_compute));
    cudaMemcpyAsync(m_words_host, m_words, mine.size() * 8, cudaMemcpyDeviceToHost, m_compute);
    Registry one;
    one.add(this);
    Status s = one.wait_idle(m_compute, nullptr);
    one.remove(this);
    TIERMEM_RETURN_IF_ERROR(s);
    std::vector<uint64_t> out(mine.size());
    std::memcpy(out.data(), m_words_host, mine.size() * 8);
    return out;
  }

  void beside_time(uint64_t* bytes, double* seconds) override {
    for (Ticket& t : m_tickets) {
      if (t.pending) collect(t);
    }
    *bytes = m_bytes;
    *seconds = m_seconds;
  }

  std::string library() const override { return library_version(); }
  Status failure() const override { return m_error.empty() ? Status() : Status(ErrorCode::io_error, m_error); }

  // ---- for the registry ----
  bool failed() const { return !m_error.empty(); }
  const std::string& error() const { return m_error; }
  std::chrono::milliseconds timeout() const { return m_timeout; }
  bool stream_idle() const { return m_side == nullptr || cudaStreamQuery(m_side) == cudaSuccess; }
  // The library's asynchronous error, if any (a peer that went away).
  std::string async_error() {
    if (m_comm == nullptr || !m_made) return std::string();
    ncclResult_t state = ncclSuccess;
    if (lib().CommGetAsyncError(m_comm, &state) != ncclSuccess) return "ncclCommGetAsyncError failed";
    if (state == ncclSuccess || state == ncclInProgress) return std::string();
    return describe("the group", state);
  }
  void abort_for(const std::string& why) {
    fail(why);
    if (m_comm != nullptr) lib().CommAbort(m_comm);
    m_comm = nullptr;
  }

 private:
  struct Ticket {
    cudaEvent_t after = nullptr, start = nullptr, done = nullptr;
    bool pending = false;
    uint64_t bytes = 0;
  };
  static constexpr uint64_t k_ring = 256;
  static constexpr size_t k_max_words = 512;

  bool usable() {
    if (!m_error.empty() || m_comm == nullptr) return false;
    if (!m_made) {
      fail("a collective call before the group was made (poll joined())");
      return false;
    }
    return true;
  }
  // A non-blocking communicator may answer ncclInProgress: the call is
  // enqueued once its state is no longer in progress.
  void call(const char* what, ncclResult_t r) {
    if (r == ncclInProgress) {
      const auto deadline = std::chrono::steady_clock::now() + m_timeout;
      ncclResult_t state = ncclInProgress;
      while (lib().CommGetAsyncError(m_comm, &state) == ncclSuccess && state == ncclInProgress &&
             std::chrono::steady_clock::now() < deadline) {
        std::this_thread::yield();
      }
      r = state;
    }
    if (r != ncclSuccess) fail(describe(what, r));
  }
  void collect(Ticket& t) {
    cudaEventSynchronize(t.done);
    float ms = 0;
    if (cudaEventElapsedTime(&ms, t.start, t.done) == cudaSuccess) {
      m_seconds += ms / 1e3;
      m_bytes += t.bytes;
    }
    (void)cudaGetLastError();
    t.pending = false;
  }
  std::string describe(const char* what, ncclResult_t r) const {
    std::string text = std::string(what) + ": " + lib().GetErrorString(r);
    const char* last = lib().GetLastError(m_comm);
    if (last != nullptr && *last != '\0') text += " (" + std::string(last) + ")";
    return "NCCL group member " + std::to_string(m_rank) + " of " + std::to_string(m_size) + ": " + text;
  }
  void fail(const std::string& what) {
    if (m_error.empty()) m_error = what;
  }

  Registry& m_registry;
  cudaStream_t m_compute;
  int m_size, m_rank;
  std::chrono::milliseconds m_timeout;
  ncclComm_t m_comm = nullptr;
  bool m_made = false;
  std::string m_error;
  cudaStream_t m_side = nullptr;
  std::vector<Ticket> m_tickets;
  uint64_t m_issued = 0, m_waited = 0;
  uint64_t m_bytes = 0;
  double m_seconds = 0;
  uint64_t* m_words = nullptr;
  uint64_t* m_words_host = nullptr;
};

std::string library_version() {
  int v = 0;
  if (!lib().error.empty() || lib().GetVersion(&v) != ncclSuccess) return "NCCL";
  // 2.28.9 is 22809 (NCCL_VERSION: major * 10000 + minor * 100 + patch).
  return "NCCL " + std::to_string(v / 10000) + "." + std::to_string(v / 100 % 100) + "." + std::to_string(v % 100);
}

Status available() {
  if (!lib().error.empty()) return Status(ErrorCode::not_supported, lib().error);
  return Status();
}

Result<std::string> unique_id() {
  if (!lib().error.empty()) return Status(ErrorCode::not_supported, lib().error);
  ncclUniqueId id;
  if (ncclResult_t r = lib().GetUniqueId(&id); r != ncclSuccess) {
    return Status(ErrorCode::io_error, std::string("ncclGetUniqueId: ") + lib().GetErrorString(r));
  }
  return std::string(reinterpret_cast<const char*>(&id), sizeof id);
}

Result<std::unique_ptr<Collective>> join(Registry& registry, cudaStream_t compute_stream, const std::string& id,
                                         int size, int rank, std::chrono::milliseconds timeout) {
  if (size < 1 || rank < 0 || rank >= size) {
    return Status(ErrorCode::invalid_argument,
                  "member " + std::to_string(rank) + " of a group of " + std::to_string(size) + " does not exist");
  }
  if (!lib().error.empty()) return Status(ErrorCode::not_supported, lib().error);
  auto group = std::make_unique<Group>(registry, compute_stream, size, rank, timeout);
  if (std::string failed = group->start(id); !failed.empty()) return Status(ErrorCode::io_error, failed);
  return std::unique_ptr<Collective>(std::move(group));
}

// ---- the registry ----

void Registry::add(Group* g) {
  std::lock_guard<std::mutex> lock(m_mu);
  m_groups.insert(g);
}
void Registry::remove(Group* g) {
  std::lock_guard<std::mutex> lock(m_mu);
  m_groups.erase(g);
}
bool Registry::empty() const {
  std::lock_guard<std::mutex> lock(m_mu);
  return m_groups.empty();
}

Status Registry::wait_idle(cudaStream_t main, cudaStream_t side) {
  std::vector<Group*> groups;
  {
    std::lock_guard<std::mutex> lock(m_mu);
    groups.assign(m_groups.begin(), m_groups.end());
  }
  std::chrono::milliseconds timeout{0};
  for (Group* g : groups) timeout = std::max(timeout, g->timeout());
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  auto idle = [](cudaStream_t s) { return s == nullptr || cudaStreamQuery(s) != cudaErrorNotReady; };
  auto give_up = [&](const std::string& why) {
    for (Group* g : groups) g->abort_for(why);
    return Status(ErrorCode::timeout, why);
  };
  for (int spins = 0;; ++spins) {
    bool done = idle(main) && idle(side);
    for (Group* g : groups) {
      if (g->failed()) return Status(ErrorCode::io_error, g->error());
      if (std::string e = g->async_error(); !e.empty()) {
        (void)give_up(e);
        return Status(ErrorCode::io_error, e);
      }
      done = done && g->stream_idle();
    }
    if (done) return Status();
    if (std::chrono::steady_clock::now() > deadline) {
      return give_up("a collective did not finish within " + std::to_string(timeout.count() / 1000) +
                     " s (the job's --timeout): a member of its group stopped or died; the groups were aborted");
    }
    if (spins > 1000) std::this_thread::sleep_for(std::chrono::microseconds(50));
  }
}

#else  // no NCCL in this build

class Group {};

std::string library_version() { return std::string(); }

Status available() {
  return Status(ErrorCode::not_supported, "this build has no NCCL (nccl.h was not found under the CUDA toolkit)");
}

Result<std::string> unique_id() {
  return Status(ErrorCode::not_supported, "this build has no NCCL (nccl.h was not found under the CUDA toolkit)");
}

Result<std::unique_ptr<Collective>> join(Registry&, cudaStream_t, const std::string&, int, int,
                                         std::chrono::milliseconds) {
  return Status(ErrorCode::not_supported, "this build has no NCCL (nccl.h was not found under the CUDA toolkit)");
}

void Registry::add(Group*) {}
void Registry::remove(Group*) {}
bool Registry::empty() const { return true; }
Status Registry::wait_idle(cudaStream_t, cudaStream_t) { return Status(); }

#endif

}  // namespace tiermem::exec::nccl
