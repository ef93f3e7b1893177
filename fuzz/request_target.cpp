#include "fuzz/request_target.hpp"

#include <unistd.h>

#include <cstdlib>
#include <filesystem>

#include <google/protobuf/stubs/logging.h>
#include <spdlog/spdlog.h>

#include "common/frame.hpp"
#include "daemon/request_checks.hpp"
#include "tiers/tier_backend.hpp"

namespace tiermem::fuzz {
namespace {

constexpr uint64_t k_page = 4096;
constexpr uint64_t k_max_frame = 1 << 20;

std::string temp_dir() {
  const char* shm = std::filesystem::is_directory("/dev/shm") ? "/dev/shm" : nullptr;
  const char* env = std::getenv("TMPDIR");
  std::string templ = std::string(shm != nullptr ? shm : env != nullptr ? env : "/tmp") + "/tiermem-fuzz-XXXXXX";
  if (::mkdtemp(templ.data()) == nullptr) return {};
  return templ;
}

}  // namespace

std::unique_ptr<RequestTarget> RequestTarget::create() {
  // Quiet: the daemon's log lines and protobuf's complaints about bad UTF-8
  // would be most of the time spent.
  spdlog::set_level(spdlog::level::off);
  google::protobuf::SetLogHandler(nullptr);
  auto t = std::unique_ptr<RequestTarget>(new RequestTarget);
  t->m_dir = temp_dir();
  if (t->m_dir.empty()) return nullptr;
  auto lock = DirectoryLock::take(t->m_dir, "the fuzz target's memory");
  if (!lock.ok()) return nullptr;
  t->m_lock = std::move(lock).value();
  DaemonConfig& c = t->m_config;
  c.node_id = 1;
  c.page_size = k_page;
  c.max_frame_bytes = k_max_frame;
  c.max_inline_bytes = k_max_frame - 4096;
  c.max_tenants_per_node = 4;
  c.default_quota[static_cast<size_t>(Tier::dram)] = 2 << 20;
  c.stale_writer_grace_ms = 0;
  auto tenants = TenantMap::create(c);
  if (!tenants.ok()) return nullptr;
  t->m_tenants.emplace(std::move(tenants).value());
  t->reset();
  return t->m_space ? std::move(t) : nullptr;
}

RequestTarget::~RequestTarget() {
  m_handler.reset();
  m_space.reset();
  std::error_code ec;
  if (!m_dir.empty()) std::filesystem::remove_all(m_dir, ec);
}

void RequestTarget::reset() {
  m_handler.reset();
  m_space.reset();
  TierSet tiers;
  const uint32_t domains = m_config.max_tenants_per_node;
  tiers[static_cast<size_t>(Tier::dram)] = std::move(make_dram_tier({m_dir, 4 << 20, domains})).value();
  tiers[static_cast<size_t>(Tier::pmem)] = std::move(make_pmem_tier({m_dir, 2 << 20, domains})).value();
  auto space = AddressSpace::create(
      {.node = 1, .page_size = k_page, .domains = domains, .versions_dir = m_dir, .incarnation = 11},
      std::move(tiers));
  if (!space.ok()) return;
  m_space = std::move(space).value();
  m_handler = std::make_unique<RequestHandler>(*m_space, m_config, *m_tenants, nullptr, nullptr, ClusterSecret(), 11);
}

bool RequestTarget::handle(const proto::Request& request, SessionState& session) {
  Reply reply = m_handler->handle(request, session);
  if (reply.deferred) reply = reply.deferred();
  ++m_requests;
  m_responses.push_back(std::move(reply.response));
  return reply.close_after;
}

void RequestTarget::run(const uint8_t* data, size_t size) {
  m_responses.clear();
  if (!m_handler || size == 0) return;
  SessionState session;
  session.id = ++m_sessions;
  // The first byte: who connected.
  switch (data[0] % 4) {
    case 0: session.uid = 0; break;        // root: an operator
    case 1: session.uid = 1000; break;     // a tenant of its own
    case 2: session.uid = 1001; session.gid = 1001; break;
    default: session.remote = true; break;  // the TCP peer port
  }
  size_t at = 1;
  while (at + wire::k_frame_header_bytes <= size) {
    const uint32_t length = wire::decode_frame_header(data + at);
    at += wire::k_frame_header_bytes;
    // A frame the server would refuse ends the connection there.
    if (!check_frame_length(length, session.greeted, m_config.max_frame_bytes).ok()) break;
    if (length > size - at) break;  // the connection closed in the middle of it
    const std::string body(reinterpret_cast<const char*>(data + at), length);
    at += length;
    proto::Request request;
    if (!parse_request(body, &request).ok()) break;
    if (handle(request, session)) break;  // the server closes the connection after this reply
  }
  m_handler->end_session(session);
}

}  // namespace tiermem::fuzz
