#include "tests/support/fake_transport.hpp"

#include <cstring>
#include <random>

namespace tiermem::test {

using sequence::Op;
using sequence::OpKind;

namespace {

std::mutex g_peers_lock;
std::map<std::string, FakeTransport*> g_peers;

class FakeRegion final : public RegisteredRegion {
 public:
  FakeRegion(sequence::RegionTable& table, uint64_t base, uint64_t length, uint64_t token)
      : m_table(table), m_base(base), m_length(length), m_key(reinterpret_cast<const char*>(&token), sizeof token) {
    m_table.add(base, length, MemoryKind::host, token);
  }
  ~FakeRegion() override { m_table.remove(m_base); }
  const std::string& packed_key() const override { return m_key; }
  uint64_t base() const override { return m_base; }
  uint64_t length() const override { return m_length; }

 private:
  sequence::RegionTable& m_table;
  uint64_t m_base;
  uint64_t m_length;
  std::string m_key;
};

class FakeKey final : public RemoteKey {
 public:
  explicit FakeKey(uint64_t token) : m_token(token) {}
  uint64_t m_token;
};

Op make_op(OpKind kind, uint64_t address, uint64_t length, RemoteKey& key) {
  Op op;
  op.kind = kind;
  op.address = address;
  op.length = length;
  op.token = static_cast<FakeKey&>(key).m_token;
  return op;
}

}  // namespace

class FakeTransport::FakeEndpoint final : public Endpoint {
 public:
  explicit FakeEndpoint(FakeTransport* peer) : m_peer(peer) {}
  bool failed() const override { return m_failed.load() || m_peer->dead(); }
  std::string transports() const override { return "fake"; }
  FakeTransport* m_peer;
  std::atomic<bool> m_failed{false};
};

struct FakeTransport::Message {
  FakeEndpoint* ep = nullptr;
  std::vector<Op> ops;
  std::vector<const void*> src;
  std::vector<void*> dst;
  std::vector<uint64_t*> result;
};

class FakeTransport::FakeBatch final : public TransportBatch {
 public:
  size_t pending() const override {
    size_t n = 0;
    for (const auto& m : m_messages) n += m->ops.size();
    return n;
  }
  std::vector<std::unique_ptr<Message>> m_messages;
  std::map<FakeEndpoint*, Message*> m_open;
};

FakeTransport::FakeTransport(std::string name, bool one_sided)
    : m_name(std::move(name)), m_address("fake:" + m_name), m_one_sided(one_sided) {
  std::lock_guard lock(g_peers_lock);
  g_peers[m_address] = this;
}

FakeTransport::~FakeTransport() {
  std::lock_guard lock(g_peers_lock);
  g_peers.erase(m_address);
}

void FakeTransport::fail(size_t nth, Fault fault, size_t ops_before_death) {
  std::lock_guard lock(m_lock);
  m_faults[nth] = {fault, ops_before_death};
}

void FakeTransport::before_running(Hook hook) {
  std::lock_guard lock(m_lock);
  m_hook = std::move(hook);
}

void FakeTransport::kill() { m_dead.store(true); }

Result<std::unique_ptr<RegisteredRegion>> FakeTransport::register_region(void* base, size_t length, MemoryKind) {
  uint64_t token = 0;
  std::random_device rd;
  while (token == 0) token = (uint64_t{rd()} << 32) | rd();
  return std::unique_ptr<RegisteredRegion>(
      new FakeRegion(m_regions, reinterpret_cast<uint64_t>(base), length, token));
}

Result<std::shared_ptr<Endpoint>> FakeTransport::connect(std::string_view address) {
  std::lock_guard lock(g_peers_lock);
  auto it = g_peers.find(std::string(address));
  if (it == g_peers.end() || it->second->dead()) {
    return Status(ErrorCode::transport_error, "fake: no peer at " + std::string(address));
  }
  return std::shared_ptr<Endpoint>(std::make_shared<FakeEndpoint>(it->second));
}

Result<std::shared_ptr<RemoteKey>> FakeTransport::unpack(const std::shared_ptr<Endpoint>&, std::string_view packed_key,
                                                         uint64_t) {
  if (packed_key.size() != sizeof(uint64_t)) return Status(ErrorCode::transport_error, "fake: a key of another size");
  uint64_t token = 0;
  std::memcpy(&token, packed_key.data(), sizeof token);
  return std::shared_ptr<RemoteKey>(std::make_shared<FakeKey>(token));
}

std::unique_ptr<TransportBatch> FakeTransport::batch() { return std::make_unique<FakeBatch>(); }

Status FakeTransport::add(TransportBatch& batch, Endpoint& ep, const Op& op, const void* src, void* dst, uint64_t* result) {
  auto& e = static_cast<FakeEndpoint&>(ep);
  if (e.failed()) return Status(ErrorCode::transport_error, "fake: the peer's endpoint failed");
  auto& b = static_cast<FakeBatch&>(batch);
  auto it = b.m_open.find(&e);
  Message* m = nullptr;
  if (it != b.m_open.end() && it->second->ops.size() < sequence::k_max_ops) {
    m = it->second;
  } else {
    b.m_messages.push_back(std::make_unique<Message>());
    m = b.m_messages.back().get();
    m->ep = &e;
    b.m_open[&e] = m;
  }
  m->ops.push_back(op);
  m->src.push_back(src);
  m->dst.push_back(dst);
  m->result.push_back(result);
  return Status();
}

Status FakeTransport::get(TransportBatch& batch, Endpoint& ep, void* dst, size_t length, uint64_t remote_addr, RemoteKey& key) {
  return add(batch, ep, make_op(OpKind::get, remote_addr, length, key), nullptr, dst, nullptr);
}

Status FakeTransport::put(TransportBatch& batch, Endpoint& ep, const void* src, size_t length, uint64_t remote_addr,
                          RemoteKey& key) {
  return add(batch, ep, make_op(OpKind::put, remote_addr, length, key), src, nullptr, nullptr);
}

Status FakeTransport::atomic(TransportBatch& batch, Endpoint& ep, AtomicOp op, uint64_t operand, uint64_t compare,
                             uint64_t remote_addr, RemoteKey& key, uint64_t* result) {
  Op o = make_op(OpKind::atomic, remote_addr, sizeof(uint64_t), key);
  o.atomic_op = static_cast<uint8_t>(op);
  o.operand = operand;
  o.compare = compare;
  return add(batch, ep, o, nullptr, nullptr, result);
}

Status FakeTransport::add_if(TransportBatch& batch, Endpoint& ep, WordCondition condition, uint64_t add_value, uint64_t undo,
                             uint64_t remote_addr, RemoteKey& key, uint64_t* old) {
  if (m_one_sided) return Status(ErrorCode::not_supported, "fake: one-sided keys take no conditional adds");
  Op o = make_op(OpKind::add_if, remote_addr, sizeof(uint64_t), key);
  o.operand = add_value;
  o.compare = condition.mask;
  o.value = condition.value;
  o.undo = undo;
  return add(batch, ep, o, nullptr, nullptr, old);
}

Status FakeTransport::persist(TransportBatch& batch, Endpoint& ep, uint64_t remote_addr, size_t length, RemoteKey& key) {
  if (m_one_sided) return Status(ErrorCode::not_supported, "fake: one-sided keys take no persists");
  return add(batch, ep, make_op(OpKind::persist, remote_addr, length, key), nullptr, nullptr, nullptr);
}

Status FakeTransport::end_group(TransportBatch& batch, Endpoint& ep, uint64_t* stopped) {
  if (m_one_sided) return Status(ErrorCode::not_supported, "fake: one-sided keys take no groups");
  return add(batch, ep, Op{.kind = OpKind::group_end}, nullptr, nullptr, stopped);
}

Status FakeTransport::barrier(TransportBatch& batch, Endpoint& ep, uint64_t* stopped) {
  if (m_one_sided) return Status(ErrorCode::not_supported, "fake: one-sided keys take no barriers");
  return add(batch, ep, Op{.kind = OpKind::barrier}, nullptr, nullptr, stopped);
}

Status FakeTransport::reserve(TransportBatch& batch, Endpoint& ep, size_t ops, size_t, size_t) {
  if (ops > sequence::k_max_ops) return Status(ErrorCode::invalid_argument, "fake: too many operations for a message");
  auto& b = static_cast<FakeBatch&>(batch);
  auto it = b.m_open.find(&static_cast<FakeEndpoint&>(ep));
  // The fake splits by operations only.
  if (it != b.m_open.end() && it->second->ops.size() + ops > sequence::k_max_ops) b.m_open.erase(it);
  return Status();
}

Status FakeTransport::flush(Endpoint& ep, std::chrono::milliseconds) {
  return ep.failed() ? Status(ErrorCode::transport_error, "fake: the peer's endpoint failed") : Status();
}

Status FakeTransport::wait(TransportBatch& batch, std::chrono::milliseconds) {
  auto& b = static_cast<FakeBatch&>(batch);
  Status first;
  for (auto& m : b.m_messages) {
    Status s = deliver(*m);
    if (first.ok() && !s.ok()) first = s;
  }
  b.m_messages.clear();
  b.m_open.clear();
  return first;
}

Status FakeTransport::run_one_sided(Message& m, size_t count) {
  FakeTransport& peer = *m.ep->m_peer;
  for (size_t i = 0; i < count; ++i) {
    const Op& op = m.ops[i];
    if (peer.m_regions.check(op.address, op.length, op.token) != sequence::Refusal::none) {
      return sequence::refusal_error(sequence::Refusal::unregistered, op);
    }
    auto* target = reinterpret_cast<std::byte*>(op.address);
    if (op.kind == OpKind::get) std::memcpy(m.dst[i], target, op.length);
    if (op.kind == OpKind::put) std::memcpy(target, m.src[i], op.length);
    if (op.kind == OpKind::atomic) {
      *m.result[i] = sequence::cpu_atomic(reinterpret_cast<uint64_t*>(target), static_cast<AtomicOp>(op.atomic_op),
                                          op.operand, op.compare);
    }
  }
  return Status();
}

Status FakeTransport::deliver(Message& m) {
  const size_t nth = m_messages.fetch_add(1);
  m_operations.fetch_add(m.ops.size());
  Planned planned{Fault::drop_request, 0};
  bool faulty = false;
  Hook hook;
  {
    std::lock_guard lock(m_lock);
    if (auto it = m_faults.find(nth); it != m_faults.end()) {
      planned = it->second;
      faulty = true;
    }
    hook = m_hook;
  }
  const Status failed(ErrorCode::transport_error, "fake: the peer's endpoint failed");
  if (m.ep->failed()) return failed;
  const Status timeout(ErrorCode::timeout, "fake: message " + std::to_string(nth) + " got no answer");
  if (faulty && planned.fault == Fault::drop_request) {
    m.ep->m_failed.store(true);  // as the real one closes the endpoint of what it gave up
    return timeout;
  }
  if (hook) hook(nth);
  FakeTransport& peer = *m.ep->m_peer;
  if (peer.dead()) return failed;
  if (m_one_sided) {
    // Operations one by one, as a NIC runs them; a peer dying stops them.
    const bool dies = faulty && planned.fault == Fault::kill_peer;
    Status s = run_one_sided(m, dies ? std::min(planned.ops_before_death, m.ops.size()) : m.ops.size());
    if (dies) {
      peer.kill();
      return failed;
    }
    if (s.ok() && faulty && planned.fault == Fault::drop_answer) {
      m.ep->m_failed.store(true);
      return timeout;
    }
    return s;
  }
  // The bytes of the puts as they are when the message goes.
  std::vector<std::byte> payload;
  for (size_t i = 0; i < m.ops.size(); ++i) {
    if (m.ops[i].kind != OpKind::put) continue;
    const auto* src = static_cast<const std::byte*>(m.src[i]);
    payload.insert(payload.end(), src, src + m.ops[i].length);
  }
  const sequence::Verdict verdict = sequence::check(m.ops, payload.size(), peer.m_regions);
  if (verdict.refusal != sequence::Refusal::none) return sequence::refusal_error(verdict.refusal, m.ops[verdict.op]);
  std::vector<std::byte> answer(sequence::answer_bytes(m.ops));
  if (faulty && planned.fault == Fault::kill_peer) {
    const size_t n = std::min(planned.ops_before_death, m.ops.size());
    (void)sequence::run(std::span<const Op>(m.ops).first(n), payload.data(), answer.data());
    peer.kill();
    return failed;
  }
  const sequence::Outcome out = sequence::run(m.ops, payload.data(), answer.data());
  if (faulty && planned.fault == Fault::drop_answer) {
    m.ep->m_failed.store(true);
    return timeout;
  }
  const auto* words = reinterpret_cast<const uint64_t*>(answer.data());
  const std::byte* gets = answer.data() + m.ops.size() * sizeof(uint64_t);
  for (size_t i = 0; i < m.ops.size() && i <= out.ran; ++i) {
    if (i == out.ran && !out.aborted) break;
    if (m.result[i] != nullptr) *m.result[i] = words[i];
    if (m.ops[i].kind == OpKind::get && i < out.ran) {
      std::memcpy(m.dst[i], gets, m.ops[i].length);
      gets += m.ops[i].length;
    }
  }
  if (out.aborted) {
    return Status(ErrorCode::failed_precondition,
                  "fake: a conditional add found its word otherwise (operation " + std::to_string(out.ran) + ")");
  }
  return Status();
}

}  // namespace tiermem::test
