// The libfabric transport's set-up: which provider, and whether it has what
// tiermem needs (fi_getinfo), the endpoint, regions, addresses, connections
// and keys. See ofi_internal.hpp.
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cstring>
#include <random>
#include <set>
#include <sstream>

#include <tiermem/status_macros.h>

#include "common/deadline.hpp"
#include "transport/ofi/ofi_internal.hpp"
#include "transport/ofi/ofi_loader.hpp"
#include "transport/ofi/ofi_shm_files.hpp"

namespace tiermem {
namespace ofi_detail {

namespace {

uint64_t random_word() {
  std::random_device rd;
  uint64_t w = 0;
  while (w == 0) w = (uint64_t{rd()} << 32) ^ rd();
  return w;
}

std::string hex(std::string_view bytes) {
  static const char* digits = "0123456789abcdef";
  std::string out;
  for (unsigned char c : bytes) {
    out += digits[c >> 4];
    out += digits[c & 15];
  }
  return out;
}

bool unhex(std::string_view text, std::string* out) {
  if (text.size() % 2 != 0) return false;
  out->clear();
  for (size_t i = 0; i < text.size(); i += 2) {
    unsigned v = 0;
    if (std::sscanf(std::string(text.substr(i, 2)).c_str(), "%2x", &v) != 1) return false;
    out->push_back(static_cast<char>(v));
  }
  return true;
}

// The providers fi_getinfo offers a reliable-datagram endpoint of here, for
// the error that says the one asked for is not among them.
std::string providers_here() {
  fi_info* hints = api().allocinfo();
  hints->ep_attr->type = FI_EP_RDM;
  fi_info* info = nullptr;
  std::set<std::string> names;
  if (api().getinfo(FI_VERSION(1, 17), nullptr, nullptr, 0, hints, &info) == 0) {
    for (fi_info* i = info; i != nullptr; i = i->next) names.insert(i->fabric_attr->prov_name);
    api().freeinfo(info);
  }
  api().freeinfo(hints);
  std::string out;
  for (const std::string& n : names) out += (out.empty() ? "" : ", ") + n;
  return out.empty() ? "none" : out;
}

}  // namespace

Status ofi_error(const std::string& what, int rc) {
  return Status(ErrorCode::transport_error, what + ": " + api().strerror(rc < 0 ? -rc : rc));
}

Status OfiTransport::open_fabric(const OfiOptions& options) {
  // What tiermem needs of every provider: reliable datagrams, tagged
  // messages, one endpoint shared by threads. No RMA or atomics: operations
  // travel as our messages (ofi_internal.hpp). Contexts start with a
  // fi_context2, so providers that ask for FI_CONTEXT(2) get it.
  auto query = [&](bool rma, bool directed, const char* node, fi_info** out) {
    fi_info* hints = api().allocinfo();
    hints->caps = FI_MSG | FI_TAGGED | (directed ? FI_DIRECTED_RECV : 0) |
                  (rma ? FI_RMA | FI_ATOMIC | FI_READ | FI_WRITE | FI_REMOTE_READ | FI_REMOTE_WRITE : 0);
    hints->mode = FI_CONTEXT | FI_CONTEXT2;
    hints->ep_attr->type = FI_EP_RDM;
    hints->domain_attr->mr_mode = FI_MR_VIRT_ADDR | FI_MR_ALLOCATED | FI_MR_PROV_KEY | FI_MR_ENDPOINT;
    hints->domain_attr->threading = FI_THREAD_SAFE;
    hints->tx_attr->msg_order = FI_ORDER_SAS;
    hints->fabric_attr->prov_name = strdup(options.provider.c_str());
    const int rc = api().getinfo(FI_VERSION(1, 17), node, nullptr, node != nullptr ? FI_SOURCE : 0, hints, out);
    api().freeinfo(hints);
    return rc;
  };
  // RMA and atomics are asked for only where they would be used
  // (choose_one_sided): on tcp;ofi_rxm asking for atomics costs ordering.
  const std::string mode = one_sided_mode(options);
  const bool want_rma = mode == "unchecked" || (mode == "auto" && checks_keys(options.provider));
  // The listen IP picks the interface (tcp: FI_SOURCE with 127.0.0.1 is
  // the lo domain); providers that do not address by IP (shm, efa, cxi)
  // find nothing for it and are asked again without.
  const char* node = options.listen_ip.empty() ? nullptr : options.listen_ip.c_str();
  int rc = -FI_ENODATA;
  bool rma_caps = false;
  for (const char* n : {node, static_cast<const char*>(nullptr)}) {
    for (bool rma : {true, false}) {
      if (rma && !want_rma) continue;
      for (bool directed : {true, false}) {
        rc = query(rma, directed, n, &m_info);
        if (rc == 0) break;
      }
      rma_caps = rma;
      if (rc == 0) break;
    }
    // Only an IP-addressed provider takes the listen IP as its source:
    // shm makes the name of its queue of it (two daemons of one host would
    // then share one, and the second fails with EBUSY).
    if (rc == 0 && n != nullptr && m_info->addr_format != FI_SOCKADDR && m_info->addr_format != FI_SOCKADDR_IN &&
        m_info->addr_format != FI_SOCKADDR_IN6) {
      api().freeinfo(m_info);
      m_info = nullptr;
      rc = -FI_ENODATA;
      continue;
    }
    if (rc == 0 || node == nullptr) break;
  }
  if (rc != 0) {
    return Status(ErrorCode::not_supported,
                  "libfabric provider '" + options.provider +
                      "' offers no reliable-datagram endpoint (FI_EP_RDM) with tagged messages (FI_TAGGED), safe "
                      "for threads (FI_THREAD_SAFE), here (fi_getinfo: " + api().strerror(-rc) +
                      "); providers here: " + providers_here());
  }
  if ((m_info->mode & ~uint64_t{FI_CONTEXT | FI_CONTEXT2}) != 0) {
    return Status(ErrorCode::not_supported, "libfabric provider '" + options.provider +
                                                "' asks for modes tiermem does not handle (mode 0x" +
                                                hex(std::string_view(reinterpret_cast<const char*>(&m_info->mode),
                                                                     sizeof m_info->mode)) + ")");
  }
  if (m_info->ep_attr->max_msg_size < sequence::k_max_bytes + k_request_buffer) {
    return Status(ErrorCode::not_supported, "libfabric provider '" + options.provider + "' sends at most " +
                                                std::to_string(m_info->ep_attr->max_msg_size) +
                                                " bytes in a message; tiermem's messages need " +
                                                std::to_string(sequence::k_max_bytes + k_request_buffer));
  }
  m_directed = (m_info->caps & FI_DIRECTED_RECV) != 0;
  m_domain_name = m_info->domain_attr->name != nullptr ? m_info->domain_attr->name : "";
  if (int r = api().fabric(m_info->fabric_attr, &m_fabric, nullptr); r != 0) return ofi_error("fi_fabric", r);
  if (int r = fi_domain(m_fabric, m_info, &m_domain, nullptr); r != 0) return ofi_error("fi_domain", r);
  // A wait fd where the provider has one (tcp); shm, efa and cxi have none
  // and their waiters sleep in short steps (ofi_operations.cpp).
  fi_cq_attr cq{};
  cq.format = FI_CQ_FORMAT_TAGGED;
  cq.wait_obj = FI_WAIT_FD;
  if (fi_cq_open(m_domain, &cq, &m_cq, nullptr) != 0) {
    cq.wait_obj = FI_WAIT_NONE;
    if (int r = fi_cq_open(m_domain, &cq, &m_cq, nullptr); r != 0) return ofi_error("fi_cq_open", r);
  } else if (fi_control(&m_cq->fid, FI_GETWAIT, &m_cq_fd) != 0) {
    m_cq_fd = -1;
  }
  fi_av_attr av{};
  av.type = FI_AV_TABLE;
  if (int r = fi_av_open(m_domain, &av, &m_av, nullptr); r != 0) return ofi_error("fi_av_open", r);
  if (int r = fi_endpoint(m_domain, m_info, &m_ep, nullptr); r != 0) return ofi_error("fi_endpoint", r);
  if (int r = fi_ep_bind(m_ep, &m_cq->fid, FI_TRANSMIT | FI_RECV); r != 0) return ofi_error("binding the CQ", r);
  if (int r = fi_ep_bind(m_ep, &m_av->fid, 0); r != 0) return ofi_error("binding the AV", r);
  if (options.provider == "shm") {
    // A queue name nobody can guess and make first (ofi_shm_files.hpp).
    TIERMEM_ASSIGN_OR_RETURN(std::string queue, fresh_shm_queue_name());
    if (int r = fi_setname(&m_ep->fid, queue.data(), queue.size() + 1); r != 0) {
      return ofi_error("naming the shm queue " + queue + " (fi_setname)", r);
    }
  }
  if (int r = fi_enable(m_ep); r != 0) return ofi_error("fi_enable", r);
  char name[k_name_max];
  size_t length = sizeof name;
  if (int r = fi_getname(&m_ep->fid, name, &length); r != 0) return ofi_error("fi_getname", r);
  m_name.assign(name, length);
  if (options.provider == "shm") {
    if (Status s = check_shm_queue(std::string_view(name, ::strnlen(name, length))); !s.ok()) {
      return s.with_context("this transport's own queue");
    }
  }
  choose_one_sided(options, rma_caps);
  return Status();
}

Status OfiTransport::init(const OfiOptions& options) {
  if (options.provider.empty()) {
    return Status(ErrorCode::invalid_argument, "the libfabric fabric needs a provider (tcp;ofi_rxm, shm, efa, ...)");
  }
  if (one_sided_mode(options).empty()) {
    return Status(ErrorCode::invalid_argument, "one_sided '" + options.one_sided +
                                                   "': auto, off or unchecked (tests and benchmarks only)");
  }
  m_provider = options.provider;
  if (m_provider == "shm") (void)sweep_dead_shm_queues_now_and_then();
  if (Status s = open_fabric(options); !s.ok()) return s;
  m_admission = random_word();
  m_origin = random_word();
  m_next_id = random_word() & (k_id_mask >> 1);
  m_next_token = random_word();
  const auto spin = std::chrono::microseconds(options.spin_us < 0 ? 30 : options.spin_us);
  m_spin.set_limit(spin);
  m_idle_spin.set_limit(transport_detail::serving_spin(spin));
  for (size_t i = 0; i < k_request_buffers; ++i) {
    m_request_buffers.push_back(std::make_unique<RequestBuffer>());
    post_request_buffer(m_request_buffers.back().get());
  }
  m_wake_fd = ::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  std::ostringstream a;
  a << "tmofi1 " << m_provider << ' ' << std::hex << m_admission << std::dec << ' ' << ::getpid() << ' '
    << hex(m_name);
  m_address = a.str();
  if (options.progress_thread) m_progress = std::thread([this] { progress_loop(); });
  return Status();
}

OfiTransport::~OfiTransport() {
  m_stop.store(true);
  if (m_progress.joinable()) {
    const uint64_t one = 1;
    (void)::write(m_wake_fd, &one, sizeof one);
    m_progress.join();
  }
  // The endpoint first: after it, the provider writes and reads none of the
  // buffers below.
  if (m_ep != nullptr) fi_close(&m_ep->fid);
  if (m_av != nullptr) fi_close(&m_av->fid);
  if (m_cq != nullptr) fi_close(&m_cq->fid);
  if (m_domain != nullptr) fi_close(&m_domain->fid);
  if (m_fabric != nullptr) fi_close(&m_fabric->fid);
  if (m_info != nullptr) api().freeinfo(m_info);
  if (m_wake_fd >= 0) ::close(m_wake_fd);
  for (const auto& [pid, p] : m_asker_processes) ::close(p.pidfd);
}

Result<std::unique_ptr<RegisteredRegion>> OfiTransport::register_region(void* base, size_t length,
                                                                        MemoryKind kind) {
  // Messages reach the region through the target's CPU, which checks the
  // token: nothing to register with the provider (device memory is refused
  // not_host by the check, as over UCX's TCP).
  PackedKey key;
  key.token = m_next_token.fetch_add(0x9e3779b97f4a7c15ull) | 1;
  fid_mr* mr = nullptr;
  if (m_one_sided && kind == MemoryKind::host) {
    auto r = register_one_sided(base, length, &key.key);
    if (!r.ok()) return r.status();
    mr = *r;
    key.flags |= PackedKey::k_one_sided;
  }
  std::string packed(reinterpret_cast<const char*>(&key), sizeof key);
  const auto b = reinterpret_cast<uint64_t>(base);
  return std::unique_ptr<RegisteredRegion>(
      std::make_unique<OfiRegion>(std::move(packed), b, length, m_regions, kind, key.token, mr));
}

Result<std::shared_ptr<Endpoint>> OfiTransport::connect(std::string_view address) {
  std::istringstream in{std::string(address)};
  std::string magic, provider, admission_hex, name_hex;
  long pid = 0;
  in >> magic >> provider >> admission_hex >> pid >> name_hex;
  std::string name;
  if (magic != "tmofi1" || !in || !unhex(name_hex, &name) || name.empty() || name.size() > k_name_max) {
    return Status(ErrorCode::invalid_argument, "not a libfabric transport address: '" +
                                                   std::string(address.substr(0, 64)) + "'");
  }
  if (provider != m_provider) {
    return Status(ErrorCode::invalid_argument, "the peer's address is of libfabric provider " + provider +
                                                   "; this transport runs " + m_provider);
  }
  const uint64_t admission = std::strtoull(admission_hex.c_str(), nullptr, 16);
  if (m_provider == "shm") {
    // The provider maps the peer's queue and trusts what it reads there:
    // only a queue of this user, closed to others, long enough.
    if (Status s = check_shm_queue(std::string_view(name.data(), ::strnlen(name.data(), name.size()))); !s.ok()) {
      return s.with_context("libfabric shm does not attach to process " + std::to_string(pid));
    }
  }
  fi_addr_t addr = FI_ADDR_NOTAVAIL;
  if (int n = fi_av_insert(m_av, name.data(), 1, &addr, 0, nullptr); n != 1) {
    if (m_provider == "shm") {
      // shm's queues are files of their owner's user (0600 in /dev/shm): a
      // process of another user cannot attach to them (EINVAL), nor to one
      // whose process is gone. Not a failure of the peer: a route the
      // caller takes otherwise (a client goes through its daemon).
      return Status(ErrorCode::not_supported,
                    "libfabric shm cannot attach to process " + std::to_string(pid) +
                        "'s queue (fi_av_insert: " + api().strerror(n < 0 ? -n : FI_EINVAL) +
                        "; shm's queues are open only to their own user's processes)");
    }
    return ofi_error("adding the peer's address (fi_av_insert)", n < 0 ? n : -FI_EINVAL);
  }
  int pidfd = -1;
  if (m_provider == "shm" && pid > 0) pidfd = static_cast<int>(::syscall(SYS_pidfd_open, static_cast<pid_t>(pid), 0));
  auto ep = std::make_shared<OfiEndpoint>(*this, addr, admission, pidfd);
  if (Status s = hello(*ep); !s.ok()) return s;
  if (pidfd >= 0) {
    std::lock_guard lock(m_watch_lock);
    m_watched.push_back(ep);
  }
  return std::shared_ptr<Endpoint>(std::move(ep));
}

Status OfiTransport::hello(OfiEndpoint& ep) {
  // Says who we are (our name: the target adds it to its address vector to
  // answer us) and presents the peer's admission token.
  OfiBatch b;
  auto m = std::make_unique<OfiMessage>();
  m->head.request.kind = MessageKind::hello;
  m->ep = &ep;
  m->waiter = &Waiter::of_this_thread();
  b.m_messages.push_back(std::move(m));
  b.m_is_done.push_back(false);
  send_message(*b.m_messages.back());
  Status error;
  Status s = drive(b, ScopedDeadline::bound(std::chrono::seconds(10)), &error);
  if (s.ok()) s = std::move(error);
  b.clear();
  return s.ok() ? s : s.with_context("the peer did not answer the hello of a new connection");
}

Result<std::shared_ptr<RemoteKey>> OfiTransport::unpack(const std::shared_ptr<Endpoint>& endpoint,
                                                        std::string_view packed, uint64_t base) {
  PackedKey key;
  if (packed.size() != sizeof key) {
    return Status(ErrorCode::invalid_argument, "not a libfabric transport's key (" + std::to_string(packed.size()) +
                                                   " bytes; a UCX node's key in a libfabric cluster?)");
  }
  std::memcpy(&key, packed.data(), sizeof key);
  if (key.version != 1) {
    return Status(ErrorCode::invalid_argument, "a libfabric key of version " + std::to_string(key.version) +
                                                   "; this build reads version 1");
  }
  auto k = std::make_shared<OfiRemoteKey>(endpoint, key.token);
  // One-sided when both ends are (the same provider and choice, in a
  // cluster; a peer's region it could not register stays on messages).
  k->m_one_sided = m_one_sided && (key.flags & PackedKey::k_one_sided) != 0;
  k->m_key = key.key;
  k->m_offset_base = m_virt_addr ? 0 : base;
  return std::shared_ptr<RemoteKey>(std::move(k));
}

void OfiTransport::report_failure(OfiEndpoint& ep, const std::string& why) {
  if (ep.m_failed.exchange(true, std::memory_order_acq_rel)) return;  // reported once
  std::lock_guard lock(m_failure_mutex);
  if (m_on_failure) m_on_failure(ep, "libfabric reports the peer failed: " + why);
}

OfiEndpoint::~OfiEndpoint() {
  // Its address stays in the address vector: a quarantined message may
  // still name it (libfabric leaves operations on removed addresses
  // undefined).
  if (m_pidfd >= 0) ::close(m_pidfd);
}

std::string OfiEndpoint::transports() const {
  return "ofi/" + m_owner.provider() + "/" + m_owner.domain_name() + " " + m_owner.one_sided_why();
}

}  // namespace ofi_detail

Result<std::unique_ptr<Transport>> make_ofi_transport(const OfiOptions& options) {
  if (auto loaded = ofi_detail::ofi_api(); !loaded.ok()) {
    return loaded.status().with_context("fabric libfabric (provider " + options.provider + ")");
  }
  auto t = std::make_unique<ofi_detail::OfiTransport>();
  OfiOptions o = options;
  if (const char* e = std::getenv("TIERMEM_OFI_ONE_SIDED"); e != nullptr && *e != '\0') o.one_sided = e;
  if (const char* e = std::getenv("TIERMEM_SPIN_US"); e != nullptr && *e != '\0' && o.spin_us < 0) {
    o.spin_us = std::clamp(std::atoi(e), 0, 10000);
  }
  if (Status s = t->init(o); !s.ok()) return s.with_context("starting libfabric (provider " + options.provider + ")");
  return std::unique_ptr<Transport>(std::move(t));
}

std::string libfabric_version() {
  // The library loaded, else the one this build's headers are of (loading
  // it only to say so would cost what ofi_loader.hpp avoids).
  const uint32_t v = ofi_detail::ofi_loaded() ? ofi_detail::api().version() : FI_VERSION(FI_MAJOR_VERSION, FI_MINOR_VERSION);
  return std::to_string(FI_MAJOR(v)) + "." + std::to_string(FI_MINOR(v));
}

}  // namespace tiermem
