// The ceiling the libfabric transport is measured against (docs/design/
// libfabric.md §6): bare fi_read and fi_write between two processes of this
// host, one in flight and 16, no protocol above them. A forked child is the target:
// it registers 64 MiB and drives progress until the parent closes their
// socket (shm and tcp;ofi_rxm carry out RMA in software inside the target's
// fi_cq_read, so a target that does not poll serves nothing).
//
// Prints in the convention of bench/remote_bench.cpp, so that bench/remote.sh
// can divide tiermem's figures by these by name:
//   ofi_raw_<p>_put_bw_<size> MB/s, ofi_raw_<p>_get_bw_<size> MB/s
//     (<size>: 8B, 4KiB, 64KiB, 1024KiB, 4096KiB; MB = 10^6 bytes), one in
//     flight (a client's call waits for its answer: the anchor), and the
//     same with _16deep, 16 in flight (the fabric's ceiling)
//   ofi_raw_<p>_get_8B_latency_p50 us  (one read at a time)
// where <p> is the provider up to its first ';' ("tcp" for tcp;ofi_rxm).
//
// Usage: ofi_raw_bench [--provider shm|"tcp;ofi_rxm"] [--seconds S]
//   S: measured seconds per size and direction (default 0.3), after a warm-up.
#include <poll.h>
#include <sched.h>
#include <rdma/fabric.h>
#include <rdma/fi_cm.h>
#include <rdma/fi_domain.h>
#include <rdma/fi_endpoint.h>
#include <rdma/fi_errno.h>
#include <rdma/fi_rma.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include <tiermem/status.h>
#include <tiermem/status_macros.h>

#include "bench/bench_util.hpp"
#include "common/unique_fd.hpp"

using namespace tiermem;

namespace {

constexpr size_t k_region_bytes = 64 << 20;
constexpr int k_depth = 16;
constexpr size_t k_sizes[] = {8, 4 << 10, 64 << 10, 1 << 20, 4 << 20};
static_assert(k_depth * (4 << 20) <= k_region_bytes, "every operation in flight has a slot of its own");

// What the target tells the initiator: where its memory is, or why it has none.
struct TargetHello {
  uint32_t error_code = 0;  // ErrorCode; 0: ready
  char error[512] = {};
  char name[256] = {};  // fi_getname bytes
  size_t name_len = 0;
  uint64_t base = 0;  // fi_read/fi_write address of the region's first byte
  uint64_t key = 0;
};

std::string size_name(size_t size) { return size < 1024 ? std::to_string(size) + "B" : std::to_string(size >> 10) + "KiB"; }

Status fi_failure(const std::string& what, ssize_t r) {
  return Status(ErrorCode::transport_error, what + ": " + fi_strerror(static_cast<int>(-r)));
}

// A page-aligned buffer, touched so that no page fault lands in a measurement.
struct AlignedBuffer {
  explicit AlignedBuffer(size_t n) : data(static_cast<char*>(std::aligned_alloc(4096, n))) { std::memset(data, 0x5a, n); }
  ~AlignedBuffer() { std::free(data); }
  AlignedBuffer(const AlignedBuffer&) = delete;
  AlignedBuffer& operator=(const AlignedBuffer&) = delete;
  char* data;
};

// One reliable-datagram endpoint with its fabric, domain, completion queue,
// address vector and memory registrations; the destructor closes them in the
// order libfabric requires (endpoint before what is bound to it).
class Endpoint {
 public:
  Endpoint() = default;
  Endpoint(const Endpoint&) = delete;
  Endpoint& operator=(const Endpoint&) = delete;
  ~Endpoint() {
    if (m_ep != nullptr) fi_close(&m_ep->fid);
    for (fid_mr* mr : m_mrs) fi_close(&mr->fid);
    if (m_av != nullptr) fi_close(&m_av->fid);
    if (m_cq != nullptr) fi_close(&m_cq->fid);
    if (m_domain != nullptr) fi_close(&m_domain->fid);
    if (m_fabric != nullptr) fi_close(&m_fabric->fid);
    if (m_info != nullptr) fi_freeinfo(m_info);
  }

  // The hints of docs/design/ofi_probe.c, RMA only. Errors: not_supported
  // when the provider offers nothing that matches; transport_error.
  Status open(const std::string& provider) {
    fi_info* hints = fi_allocinfo();
    hints->caps = FI_MSG | FI_RMA | FI_READ | FI_WRITE | FI_REMOTE_READ | FI_REMOTE_WRITE;
    hints->mode = FI_CONTEXT;
    hints->ep_attr->type = FI_EP_RDM;
    hints->domain_attr->mr_mode = FI_MR_LOCAL | FI_MR_VIRT_ADDR | FI_MR_ALLOCATED | FI_MR_PROV_KEY;
    // As the transport asks: the ceiling pays the same locking.
    hints->domain_attr->threading = FI_THREAD_SAFE;
    hints->fabric_attr->prov_name = strdup(provider.c_str());
    // tcp takes its interface from the source address (lo); -d lo is ignored
    // by rxm, which then answers with eth0.
    const bool by_ip = provider.starts_with("tcp");
    const int r = fi_getinfo(FI_VERSION(1, 17), by_ip ? "127.0.0.1" : nullptr, nullptr, by_ip ? FI_SOURCE : 0,
                             hints, &m_info);
    fi_freeinfo(hints);
    if (r != 0) {
      m_info = nullptr;
      return Status(ErrorCode::not_supported, "libfabric provider '" + provider +
                                                  "' offers no reliable-datagram endpoint with RMA here (fi_getinfo: " +
                                                  fi_strerror(-r) + "); `fi_info -l` lists the providers present");
    }
    if (m_info->domain_attr->mr_key_size > sizeof(uint64_t)) {
      return Status(ErrorCode::not_supported, "provider '" + provider + "' has keys of " +
                                                  std::to_string(m_info->domain_attr->mr_key_size) +
                                                  " bytes (FI_MR_RAW), which this benchmark does not exchange");
    }
    if (int e = fi_fabric(m_info->fabric_attr, &m_fabric, nullptr); e != 0) return fi_failure("fi_fabric", e);
    if (int e = fi_domain(m_fabric, m_info, &m_domain, nullptr); e != 0) return fi_failure("fi_domain", e);
    // No wait object: both sides spin, as a ceiling should (shm has none anyway).
    fi_cq_attr cq_attr{};
    cq_attr.format = FI_CQ_FORMAT_CONTEXT;
    cq_attr.wait_obj = FI_WAIT_NONE;
    cq_attr.size = 1024;
    if (int e = fi_cq_open(m_domain, &cq_attr, &m_cq, nullptr); e != 0) return fi_failure("fi_cq_open", e);
    fi_av_attr av_attr{};
    av_attr.type = FI_AV_TABLE;
    if (int e = fi_av_open(m_domain, &av_attr, &m_av, nullptr); e != 0) return fi_failure("fi_av_open", e);
    if (int e = fi_endpoint(m_domain, m_info, &m_ep, nullptr); e != 0) return fi_failure("fi_endpoint", e);
    if (int e = fi_ep_bind(m_ep, &m_cq->fid, FI_TRANSMIT | FI_RECV); e != 0) return fi_failure("fi_ep_bind(cq)", e);
    if (int e = fi_ep_bind(m_ep, &m_av->fid, 0); e != 0) return fi_failure("fi_ep_bind(av)", e);
    if (int e = fi_enable(m_ep); e != 0) return fi_failure("fi_enable", e);
    return Status();
  }

  // Registers `n` bytes at `base`; the registration lives as long as this.
  Result<fid_mr*> register_memory(void* base, size_t n, uint64_t access, uint64_t requested_key) {
    fid_mr* mr = nullptr;
    if (int e = fi_mr_reg(m_domain, base, n, access, 0, requested_key, 0, &mr, nullptr); e != 0) {
      return fi_failure("fi_mr_reg of " + std::to_string(n) + " bytes", e);
    }
    m_mrs.push_back(mr);
    return mr;
  }

  // Drives progress; stores the contexts of up to `n` finished operations
  // and returns how many. An operation that failed is an error.
  Result<int> reap(void** contexts, int n) {
    std::array<fi_cq_entry, k_depth> entries;
    const ssize_t got = fi_cq_read(m_cq, entries.data(), static_cast<size_t>(std::min(n, k_depth)));
    if (got == -FI_EAGAIN) {
      // Both processes spin; when they share a core, the one spinning keeps
      // it until the scheduler's tick (4 ms at HZ=250) and every round trip
      // of tcp;ofi_rxm took two ticks. Yielding now and then hands it over.
      if (++m_idle % 16 == 0) ::sched_yield();
      return 0;
    }
    if (got == -FI_EAVAIL) {
      fi_cq_err_entry err{};
      fi_cq_readerr(m_cq, &err, 0);
      return Status(ErrorCode::transport_error,
                    std::string("an RMA operation failed: ") + fi_strerror(err.err) + " (provider: " +
                        fi_cq_strerror(m_cq, err.prov_errno, err.err_data, nullptr, 0) + ")");
    }
    if (got < 0) return fi_failure("fi_cq_read", got);
    for (ssize_t i = 0; i < got; ++i) contexts[i] = entries[static_cast<size_t>(i)].op_context;
    return static_cast<int>(got);
  }

  const fi_info* info() const { return m_info; }
  fid_ep* ep() const { return m_ep; }
  fid_av* av() const { return m_av; }

 private:
  fi_info* m_info = nullptr;
  fid_fabric* m_fabric = nullptr;
  fid_domain* m_domain = nullptr;
  fid_cq* m_cq = nullptr;
  fid_av* m_av = nullptr;
  fid_ep* m_ep = nullptr;
  std::vector<fid_mr*> m_mrs;
  uint64_t m_idle = 0;  // progress calls that found nothing
};

Status write_all(int fd, const void* p, size_t n) {
  const char* c = static_cast<const char*>(p);
  while (n > 0) {
    const ssize_t w = ::write(fd, c, n);
    if (w <= 0) return Status(ErrorCode::io_error, std::string("write to the other process: ") + std::strerror(errno));
    c += w;
    n -= static_cast<size_t>(w);
  }
  return Status();
}

Status read_all(int fd, void* p, size_t n) {
  char* c = static_cast<char*>(p);
  while (n > 0) {
    const ssize_t r = ::read(fd, c, n);
    if (r <= 0) return Status(ErrorCode::connection_closed, "the target exited before it sent its address");
    c += r;
    n -= static_cast<size_t>(r);
  }
  return Status();
}

// The child: registers the region, sends its address, and drives progress
// until the initiator's end of `sock` closes (also when the initiator dies).
int serve(int sock, const std::string& provider) {
  AlignedBuffer region(k_region_bytes);  // outlives the endpoint that registers it
  Endpoint e;
  TargetHello h;
  Status s = e.open(provider);
  Result<fid_mr*> mr = s.ok() ? e.register_memory(region.data, k_region_bytes, FI_REMOTE_READ | FI_REMOTE_WRITE, 1)
                              : Result<fid_mr*>(s);
  if (mr.ok()) {
    h.name_len = sizeof h.name;
    if (int r = fi_getname(&e.ep()->fid, h.name, &h.name_len); r != 0) mr = fi_failure("fi_getname", r);
  }
  if (!mr.ok()) {
    h.error_code = static_cast<uint32_t>(mr.status().code());
    std::snprintf(h.error, sizeof h.error, "%s", mr.status().message().c_str());
  } else {
    // Without FI_MR_VIRT_ADDR (tcp;ofi_rxm) the region is addressed by offset.
    const bool virt = (e.info()->domain_attr->mr_mode & FI_MR_VIRT_ADDR) != 0;
    h.base = virt ? reinterpret_cast<uint64_t>(region.data) : 0;
    h.key = fi_mr_key(*mr);
  }
  if (!write_all(sock, &h, sizeof h).ok() || !mr.ok()) return 1;
  pollfd stop{.fd = sock, .events = POLLIN, .revents = 0};
  for (uint64_t i = 0;; ++i) {
    void* ignored[k_depth];
    (void)e.reap(ignored, k_depth);  // the target posts nothing: only progress
    // A poll per 256 progress calls: one per call would put a system call
    // in front of every piece of software RMA this process serves.
    if (i % 256 == 0 && ::poll(&stop, 1, 0) > 0) return 0;
  }
}

enum class Op { get, put };

// The initiator's side: its endpoint, the target and a local buffer with a
// slot per operation in flight.
struct Initiator {
  AlignedBuffer local{k_region_bytes};  // outlives the endpoint that registers it
  Endpoint e;
  fi_addr_t peer = FI_ADDR_UNSPEC;
  uint64_t base = 0, key = 0;
  void* desc = nullptr;
  std::array<fi_context2, k_depth> contexts{};

  ssize_t post(Op op, int slot, size_t size) {
    const size_t at = static_cast<size_t>(slot) * size;
    fi_context2* c = &contexts[static_cast<size_t>(slot)];
    return op == Op::get ? fi_read(e.ep(), local.data + at, size, desc, peer, base + at, key, c)
                         : fi_write(e.ep(), local.data + at, size, desc, peer, base + at, key, c);
  }

  // Bytes per second of `op` at `size` with `depth` in flight: posts for
  // `seconds`, then counts until the last operation is back.
  Result<double> stream(Op op, size_t size, double seconds, int depth) {
    std::vector<int> free_slots;
    for (int i = depth - 1; i >= 0; --i) free_slots.push_back(i);
    uint64_t bytes = 0;
    const double start = bench::now_seconds();
    while (true) {
      const bool posting = bench::now_seconds() - start < seconds;
      while (posting && !free_slots.empty()) {
        const ssize_t r = post(op, free_slots.back(), size);
        if (r == -FI_EAGAIN) break;  // the provider's queue is full: progress first
        if (r != 0) return fi_failure(std::string(op == Op::get ? "fi_read" : "fi_write") + " of " + size_name(size), r);
        free_slots.pop_back();
      }
      if (!posting && free_slots.size() == static_cast<size_t>(depth)) break;
      void* done[k_depth];
      TIERMEM_ASSIGN_OR_RETURN(const int n, e.reap(done, k_depth));
      for (int i = 0; i < n; ++i) {
        free_slots.push_back(static_cast<int>(static_cast<fi_context2*>(done[i]) - contexts.data()));
        bytes += size;
      }
    }
    return static_cast<double>(bytes) / (bench::now_seconds() - start);
  }

  // Seconds of one 8-byte read, alone in flight; retries -FI_EAGAIN (rxm
  // answers so while it connects to a new peer) within 10 s.
  Result<double> one_read() {
    const double start = bench::now_seconds();
    ssize_t r;
    while ((r = post(Op::get, 0, 8)) == -FI_EAGAIN && bench::now_seconds() - start < 10) {
      void* ignored[1];
      if (auto p = e.reap(ignored, 1); !p.ok()) return p.status();
    }
    if (r != 0) return fi_failure("fi_read of 8 bytes", r);
    void* done[1];
    int n = 0;
    while (n == 0) {
      TIERMEM_ASSIGN_OR_RETURN(n, e.reap(done, 1));
      if (n == 0 && bench::now_seconds() - start > 10) {
        return Status(ErrorCode::timeout, "an 8-byte fi_read did not complete within 10 s");
      }
    }
    return bench::now_seconds() - start;
  }
};

Status initiate(int sock, const std::string& provider, double seconds) {
  TargetHello h;
  TIERMEM_RETURN_IF_ERROR(read_all(sock, &h, sizeof h));
  if (h.error_code != 0) return Status(static_cast<ErrorCode>(h.error_code), std::string("target: ") + h.error);
  Initiator in;
  TIERMEM_RETURN_IF_ERROR(in.e.open(provider));
  if (fi_av_insert(in.e.av(), h.name, 1, &in.peer, 0, nullptr) != 1) {
    return Status(ErrorCode::transport_error, "fi_av_insert did not take the target's address");
  }
  in.base = h.base;
  in.key = h.key;
  TIERMEM_ASSIGN_OR_RETURN(fid_mr * mr, in.e.register_memory(in.local.data, k_region_bytes, FI_READ | FI_WRITE, 2));
  in.desc = fi_mr_desc(mr);
  const fi_info* info = in.e.info();
  const std::string p = provider.substr(0, provider.find(';'));
  bench::note("raw fi_read/fi_write, provider " + provider + ", domain " + info->domain_attr->name + ", " +
              "1 and " + std::to_string(k_depth) + " in flight (_" + std::to_string(k_depth) + "deep), " +
              std::to_string(seconds) + " s per figure; target: a child process");
  // The first operation connects (rxm: ~150 ms); not part of any figure.
  if (auto first = in.one_read(); !first.ok()) return first.status();
  for (size_t size : k_sizes) {
    if (size > info->ep_attr->max_msg_size) {
      bench::note(size_name(size) + " is above the provider's max_msg_size; skipped");
      continue;
    }
    // One in flight: the anchor of a client's call, which waits for its
    // answer (remote.sh's ratios); k_depth in flight: the fabric's ceiling.
    for (Op op : {Op::put, Op::get}) {
      for (int depth : {1, k_depth}) {
        if (auto warm = in.stream(op, size, std::min(0.1, seconds), depth); !warm.ok()) return warm.status();
        TIERMEM_ASSIGN_OR_RETURN(const double rate, in.stream(op, size, seconds, depth));
        const std::string name = std::string(op == Op::get ? "_get_bw_" : "_put_bw_") + size_name(size) +
                                 (depth == 1 ? "" : "_" + std::to_string(depth) + "deep");
        bench::figure("ofi_raw_" + p + name, rate / 1e6, "MB/s");
      }
    }
  }
  std::vector<double> lat;
  const double start = bench::now_seconds();
  while (lat.size() < 100 || (lat.size() < 100000 && bench::now_seconds() - start < seconds)) {
    TIERMEM_ASSIGN_OR_RETURN(const double t, in.one_read());
    lat.push_back(t);
  }
  bench::figure("ofi_raw_" + p + "_get_8B_latency_p50", bench::percentile(lat, 0.5) * 1e6, "us");
  return Status();
}

}  // namespace

int main(int argc, char** argv) {
  std::string provider = "tcp;ofi_rxm";
  double seconds = 0.3;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--provider" && i + 1 < argc) {
      provider = argv[++i];
    } else if (a == "--seconds" && i + 1 < argc) {
      seconds = std::atof(argv[++i]);
    } else {
      std::fprintf(stderr, "usage: ofi_raw_bench [--provider shm|\"tcp;ofi_rxm\"] [--seconds S]\n");
      return 2;
    }
  }
  int pair[2];
  if (::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, pair) != 0) {
    std::perror("ofi_raw_bench: socketpair");
    return 1;
  }
  std::fflush(stdout);  // or the child flushes the parent's buffered lines again
  // Each process opens libfabric after the fork: a provider's state is not
  // meant to be shared by a parent and its child.
  const pid_t child = ::fork();
  if (child < 0) {
    std::perror("ofi_raw_bench: fork");
    return 1;
  }
  if (child == 0) {
    ::close(pair[0]);
    std::_Exit(serve(pair[1], provider));
  }
  ::close(pair[1]);
  UniqueFd sock(pair[0]);
  const Status s = initiate(sock.get(), provider, seconds);
  sock.reset();  // the target's signal to stop
  int wstatus = 0;
  ::waitpid(child, &wstatus, 0);
  if (!s.ok()) {
    std::fprintf(stderr, "ofi_raw_bench: %s\n", s.to_string().c_str());
    return 1;
  }
  if (!WIFEXITED(wstatus) || WEXITSTATUS(wstatus) != 0) {
    std::fprintf(stderr, "ofi_raw_bench: the target process ended abnormally (wait status %d)\n", wstatus);
    return 1;
  }
  return 0;
}
