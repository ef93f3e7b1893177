// One libtiermem call, made by whoever runs this (the security tests run it
// as other users, with setpriv), with the outcome on stdout:
//   ok [RESULT]            the call succeeded
//   error CODE MESSAGE     it failed (CODE: the ErrorCode number)
// Exit status 0 either way; 2 for a usage error.
//
//   tenant_probe SOCKET [--direct|--daemon] OP ARGS...
//     alloc SIZE TIER [NAME] [NODE]   prints the GVA
//     write GVA TEXT | read GVA LENGTH | free GVA | translate GVA
//     map GVA                         prints SIZE:FIRST-BYTES (SIZE:cuda:N for VRAM)
//     fetch_add GVA | compare_swap GVA | migrate GVA TIER [NODE]
//     lookup NAME [NODE] | list [NODE] (prints the GVAs) | stat [NODE]
//     regions    the tenants whose memory files the daemon hands this
//                process (read from the version segments it was given)
//     device_chunks FRAME_OFFSET LENGTH   asks for the VRAM chunks of those
//                frames as libtiermem does, prints how many descriptors came
//     hold MS    connects, prints "ok", and stays connected MS ms (checking
//                in every $TIERMEM_CHECKIN_INTERVAL_MS)
//     damage WHAT   does to its own domain's files, as the descriptors the
//                daemon hands it allow, what a hostile tenant would:
//                  header          tries to write its segment header every
//                                  way the descriptor might allow; prints
//                                  "ok refused" when none does
//                  versions-grow   its version words file, 4 KiB longer
//                  versions-cut    its version words file, to 0 bytes
//                  versions-odd    every word of its version words made odd (locked)
//                  dram-cut | pmem-cut   its DRAM or PMEM file, to 0 bytes
//                  dram-grow | pmem-grow  its DRAM or PMEM file 1 GiB longer,
//                                  16 MiB of it written (storage taken)
//                  dram-fill       every page of its DRAM and version-word
//                                  files made a hole (fallocate PUNCH_HOLE),
//                                  then its DRAM file 1 GiB longer, written
//                                  until the file system is full: the
//                                  daemon's next touch of those pages needs
//                                  storage that is not there
//     recovery   what stat says this start lost: "lost ... | anew ..." lines
//     route GVA  reads 8 bytes at GVA and prints how the call travelled:
//                "message=N through_daemon=N direct=N fallbacks=N" and
//                the time it took, "ms=N"
//     maphold GVA   maps GVA, writes "held" through the mapping and prints
//                "ok mapped"; waits (up to 30 s) until the mapping is revoked
//                and prints "revoked CODE MESSAGE" (or "still ok"); then
//                writes through it again (which faults once it is revoked)
//                and prints "wrote"
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <tiermem/client.h>
#include <tiermem/status_macros.h>

#include "pages/segment_layout.hpp"
#include "rpc_connection.hpp"

namespace {

using tiermem::Gva;
using tiermem::Status;

tiermem::Tier tier_of(const std::string& name) {
  if (name == "dram") return tiermem::Tier::dram;
  if (name == "pmem") return tiermem::Tier::pmem;
  if (name == "vram") return tiermem::Tier::vram;
  return tiermem::Tier::automatic;
}

int report(const Status& s, const std::string& result = "") {
  if (s.ok()) {
    std::printf("ok %s\n", result.c_str());
  } else {
    std::printf("error %u %s\n", static_cast<unsigned>(s.code()), s.message().c_str());
  }
  return 0;
}

template <typename T>
int report(const tiermem::Result<T>& r, const std::string& result) {
  return report(r.status(), r.ok() ? result : "");
}

// A raw session as libtiermem opens one: hello, then its regions (the
// session's domain is given to it here); the response and descriptors.
struct RawSession {
  std::unique_ptr<tiermem::RpcConnection> connection;
  tiermem::proto::Response regions;
  std::vector<tiermem::UniqueFd> fds;
};

tiermem::Result<RawSession> raw_session(const char* socket) {
  RawSession out;
  TIERMEM_ASSIGN_OR_RETURN(out.connection, tiermem::RpcConnection::connect_unix(socket));
  tiermem::proto::Request hello;
  hello.mutable_hello()->set_protocol_version(tiermem::proto::PROTOCOL_VERSION_CURRENT);
  TIERMEM_RETURN_IF_ERROR(out.connection->call(hello).status());
  tiermem::proto::Request open;
  open.mutable_open_regions();
  TIERMEM_ASSIGN_OR_RETURN(out.regions, out.connection->call(open, &out.fds));
  return out;
}

// Asks for the session's regions as libtiermem does and reads the tenant of
// every segment header among the descriptors that came.
int regions(const char* socket) {
  auto r = raw_session(socket);
  if (!r.ok()) return report(r.status());
  std::string tenants;
  size_t next = 0;
  for (const auto& region : r->regions.open_regions().regions()) {
    if (!region.has_fd()) continue;
    const int fd = r->fds.at(next++).get();
    if (region.kind() != tiermem::proto::Region::HEADER) continue;
    void* p = ::mmap(nullptr, tiermem::k_segment_header_bytes, PROT_READ, MAP_SHARED, fd, 0);
    if (p == MAP_FAILED) continue;
    tenants += std::string(static_cast<const tiermem::SegmentHeader*>(p)->tenant) + " ";
    ::munmap(p, tiermem::k_segment_header_bytes);
  }
  return report(Status(), tenants);
}

// What a hostile tenant does to its own files (see the header comment).
int damage(const char* socket, const std::string& what) {
  auto r = raw_session(socket);
  if (!r.ok()) return report(r.status());
  int header = -1, versions = -1, dram = -1, pmem = -1;
  uint64_t versions_bytes = 0;
  size_t next = 0;
  for (const auto& region : r->regions.open_regions().regions()) {
    if (!region.has_fd()) continue;
    const int fd = r->fds.at(next++).get();
    using K = tiermem::proto::Region;
    if (region.kind() == K::HEADER && header < 0) header = fd;
    if (region.kind() == K::VERSIONS && versions < 0) {
      versions = fd;
      versions_bytes = region.length();
    }
    if (region.kind() == K::TIER && region.tier() == tiermem::proto::TIER_DRAM && dram < 0) dram = fd;
    if (region.kind() == K::TIER && region.tier() == tiermem::proto::TIER_PMEM && pmem < 0) pmem = fd;
  }
  const auto failed = [](const std::string& how) {
    return report(Status(tiermem::ErrorCode::internal, how + ": " + std::strerror(errno)));
  };
  if (what == "header") {
    if (header < 0) return report(Status(tiermem::ErrorCode::not_found, "no segment header was handed out"));
    std::string allowed;
    void* p = ::mmap(nullptr, tiermem::k_segment_header_bytes, PROT_READ | PROT_WRITE, MAP_SHARED, header, 0);
    if (p != MAP_FAILED) {
      allowed += "a writable mapping; ";
      static_cast<tiermem::SegmentHeader*>(p)->memory_generation ^= 1;  // what the probe of the issue did
      ::munmap(p, tiermem::k_segment_header_bytes);
    }
    const uint64_t junk = 0x4141414141414141;
    if (::pwrite(header, &junk, sizeof junk, 0) == static_cast<ssize_t>(sizeof junk)) allowed += "pwrite; ";
    if (::ftruncate(header, 8192) == 0) allowed += "ftruncate; ";
    const std::string reopen = "/proc/self/fd/" + std::to_string(header);
    const int again = ::open(reopen.c_str(), O_RDWR);
    if (again >= 0) {
      allowed += "reopening it read-write; ";
      ::close(again);
    }
    if (!allowed.empty()) return report(Status(tiermem::ErrorCode::internal, "the header could be written: " + allowed));
    return report(Status(), "refused");
  }
  if (what == "versions-grow") {
    if (::ftruncate(versions, static_cast<off_t>(versions_bytes + 4096)) != 0) return failed("ftruncate");
  } else if (what == "versions-cut") {
    if (::ftruncate(versions, 0) != 0) return failed("ftruncate");
  } else if (what == "versions-odd") {
    void* p = ::mmap(nullptr, versions_bytes, PROT_READ | PROT_WRITE, MAP_SHARED, versions, 0);
    if (p == MAP_FAILED) return failed("mmap");
    auto* words = static_cast<uint64_t*>(p);
    for (uint64_t i = 0; i < versions_bytes / (3 * sizeof(uint64_t)); ++i) words[i] |= 1;
    ::munmap(p, versions_bytes);
  } else if (what == "dram-cut" || what == "pmem-cut") {
    const int fd = what == "dram-cut" ? dram : pmem;
    if (fd < 0) return report(Status(tiermem::ErrorCode::not_found, "no such file was handed out"));
    if (::ftruncate(fd, 0) != 0) return failed("ftruncate");
  } else if (what == "dram-grow" || what == "pmem-grow" || what == "dram-fill") {
    const int fd = what == "pmem-grow" ? pmem : dram;
    if (fd < 0) return report(Status(tiermem::ErrorCode::not_found, "no such file was handed out"));
    struct stat st {};
    if (::fstat(fd, &st) != 0) return failed("fstat");
    const off_t end = st.st_size;
    if (::ftruncate(fd, end + (off_t{1} << 30)) != 0) return failed("ftruncate");
    const std::vector<char> chunk(1 << 20, 'B');
    const int chunks = what == "dram-fill" ? 1024 : 16;
    if (what == "dram-fill") {
      // Holes first, then the file system filled: the daemon's next touch
      // of these pages needs storage that is not there.
      if (::fallocate(dram, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, 0, end) != 0) return failed("punching DRAM");
      if (::fallocate(versions, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, 0, static_cast<off_t>(versions_bytes)) != 0) {
        return failed("punching the version words");
      }
    }
    for (int i = 0; i < chunks; ++i) {
      errno = 0;
      const ssize_t wrote = ::pwrite(fd, chunk.data(), chunk.size(), end + off_t{i} * (1 << 20));
      if (wrote != static_cast<ssize_t>(chunk.size())) {
        // Full (a short write, or ENOSPC): what dram-fill wanted.
        if (what == "dram-fill" && (wrote >= 0 || errno == ENOSPC)) break;
        return failed("pwrite");
      }
    }
  } else {
    return report(Status(tiermem::ErrorCode::invalid_argument, "no such damage: " + what));
  }
  return report(Status(), what);
}

// The raw request libtiermem makes for VRAM chunks (its tenant check is the
// daemon's, whatever the client library would ask).
int device_chunks(const char* socket, uint64_t offset, uint64_t length) {
  auto session = raw_session(socket);
  if (!session.ok()) return report(session.status());
  tiermem::proto::Request r;
  r.mutable_device_chunks()->set_tier(tiermem::proto::TIER_VRAM);
  r.mutable_device_chunks()->set_frame_offset(offset);
  r.mutable_device_chunks()->set_length(length);
  std::vector<tiermem::UniqueFd> fds;
  auto got = session->connection->call(r, &fds);
  if (!got.ok()) return report(got.status());
  return report(Status(), std::to_string(fds.size()));
}

int usage() {
  std::fprintf(stderr, "usage: tenant_probe SOCKET [--direct|--daemon] OP ARGS...\n");
  return 2;
}

tiermem::NodeId node_arg(const std::vector<std::string>& a, size_t i) {
  return i < a.size() ? static_cast<tiermem::NodeId>(std::strtoul(a[i].c_str(), nullptr, 10)) : 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 3) return usage();
  std::vector<std::string> a(argv + 2, argv + argc);
  bool direct = true;
  if (a[0] == "--direct" || a[0] == "--daemon") {
    direct = a[0] == "--direct";
    a.erase(a.begin());
  }
  if (a.empty()) return usage();
  if (a[0] == "regions") return regions(argv[1]);
  if (a[0] == "damage" && a.size() >= 2) return damage(argv[1], a[1]);
  if (a[0] == "device_chunks" && a.size() >= 3) {
    return device_chunks(argv[1], std::strtoull(a[1].c_str(), nullptr, 10), std::strtoull(a[2].c_str(), nullptr, 10));
  }
  std::string fell_back;  // why a data plane was given up (route prints it)
  auto client = tiermem::Client::connect({.socket_path = argv[1],
                                          .client_name = "probe",
                                          .direct_access = direct,
                                          .on_data_plane_fallback = [&](tiermem::NodeId, const Status& why) {
                                            fell_back = why.message();
                                          }});
  if (!client.ok()) return report(client.status());
  tiermem::Client& c = **client;
  const std::string& op = a[0];
  Gva gva;
  if (op == "hold" && a.size() >= 2) {
    report(Status());
    std::fflush(stdout);
    std::this_thread::sleep_for(std::chrono::milliseconds(std::atoll(a[1].c_str())));
    return 0;
  }
  if (op == "recovery") {
    auto r = c.stat();
    std::string lines;
    for (const std::string& l : r.ok() ? r->recovery.lost : std::vector<std::string>{}) lines += "lost " + l + " | ";
    for (const std::string& d : r.ok() ? r->recovery.domains_made_anew : std::vector<std::string>{}) {
      lines += "anew " + d + " | ";
    }
    return report(r, lines);
  }
  if (op != "alloc" && op != "lookup" && op != "list" && op != "stat" && op != "metrics") {
    if (a.size() < 2) return usage();
    auto parsed = Gva::parse(a[1]);
    if (!parsed.ok()) return report(parsed.status());
    gva = *parsed;
  }
  if (op == "alloc" && a.size() >= 3) {
    tiermem::AllocOptions o;
    o.tier = tier_of(a[2]);
    o.strict = true;
    if (a.size() > 3) o.name = a[3];
    o.node = node_arg(a, 4);
    auto r = c.alloc(std::strtoull(a[1].c_str(), nullptr, 10), o);
    return report(r, r.ok() ? r->gva.to_string() : "");
  }
  if (op == "write" && a.size() >= 3) return report(c.write(gva, a[2].data(), a[2].size()));
  if (op == "read" && a.size() >= 3) {
    std::string out(std::strtoull(a[2].c_str(), nullptr, 10), '\0');
    const Status s = c.read(gva, out.data(), out.size());
    return report(s, out.c_str());
  }
  if (op == "free") return report(c.free(gva));
  if (op == "map") {
    auto m = c.map(gva);
    if (m.ok() && m->device() >= 0) {
      return report(Status(), std::to_string(m->size()) + ":cuda:" + std::to_string(m->device()));
    }
    // Its size, and its first bytes as text (up to a NUL, at most 16).
    std::string head;
    for (size_t i = 0; m.ok() && i < std::min<size_t>(m->size(), 16) && m->data()[i] != std::byte{0}; ++i) {
      head += static_cast<char>(m->data()[i]);
    }
    return report(m, m.ok() ? std::to_string(m->size()) + ":" + head : "");
  }
  if (op == "maphold") {
    auto m = c.map(gva);
    if (!m.ok()) return report(m.status());
    std::memcpy(m->data(), "held", 4);
    std::printf("ok mapped\n");
    std::fflush(stdout);
    Status s;
    for (int i = 0; i < 3000 && (s = m->status()).ok(); ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    if (s.ok()) {
      std::printf("still ok\n");
    } else {
      std::printf("revoked %u %s\n", static_cast<unsigned>(s.code()), s.message().c_str());
    }
    std::fflush(stdout);
    std::memcpy(m->data(), "late", 4);
    std::printf("wrote\n");
    return 0;
  }
  if (op == "route") {
    uint64_t word = 0;
    const auto start = std::chrono::steady_clock::now();
    const Status s = c.read(gva, &word, sizeof word);
    const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - start);
    const tiermem::AccessCounters n = c.access_counters();
    return report(s, "message=" + std::to_string(n.message) + " through_daemon=" + std::to_string(n.through_daemon) +
                         " direct=" + std::to_string(n.direct_remote) + " fallbacks=" +
                         std::to_string(n.plane_fallbacks) + " ms=" + std::to_string(ms.count()) +
                         (fell_back.empty() ? "" : " why=" + fell_back));
  }
  if (op == "translate") {
    auto t = c.translate(gva);
    return report(t, t.ok() ? t->allocation.tenant : "");
  }
  if (op == "fetch_add") {
    auto r = c.fetch_add(gva, 1);
    return report(r, r.ok() ? std::to_string(*r) : "");
  }
  if (op == "compare_swap") {
    auto r = c.compare_swap(gva, 0, 1);
    return report(r, r.ok() ? std::to_string(*r) : "");
  }
  if (op == "migrate" && a.size() >= 3) {
    auto r = c.migrate(gva, tier_of(a[2]), node_arg(a, 3));
    return report(r, r.ok() ? r->gva.to_string() : "");
  }
  if (op == "lookup" && a.size() >= 2) {
    auto r = c.lookup(a[1], node_arg(a, 2));
    return report(r, r.ok() ? r->gva.to_string() : "");
  }
  if (op == "list") {
    auto r = c.list(node_arg(a, 1));
    std::string gvas;
    if (r.ok()) {
      for (const auto& info : *r) gvas += info.gva.to_string() + " ";
    }
    return report(r, gvas);
  }
  if (op == "stat") {
    auto r = c.stat(node_arg(a, 1));
    return report(r, r.ok() ? std::to_string(r->allocations) : "");
  }
  if (op == "metrics") {  // the bytes of the exposition it got
    auto r = c.metrics(node_arg(a, 1));
    return report(r, r.ok() ? std::to_string(r->size()) : "");
  }
  return usage();
}
