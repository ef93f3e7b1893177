// An in-process Transport for unit tests of the page protocol over the data
// plane, in the manner of LevelDB's ErrorEnv: it imitates the real one (a
// batch to one endpoint is one message, checked whole and run in order by the
// same code the UCX transport's target runs: transport/message_sequence) and
// fails on demand: a message can be lost before it runs or after (its answer
// lost), held back while a hook acts as another process would, or its peer
// killed after running some of its operations.
//
// Peers are other FakeTransport objects of the same process, reached by
// address. A transport made `one_sided` imitates InfiniBand instead: its
// keys are one-sided, operations run one by one at wait() and conditional
// adds and persists are not supported.
#pragma once

#include <atomic>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "transport/message_sequence.hpp"
#include "transport/transport.hpp"

namespace tiermem::test {

class FakeTransport final : public Transport {
 public:
  // What to do to the nth message (0-based, counted over all of this
  // transport's messages as the asker).
  enum class Fault {
    drop_request,  // lost on the way: nothing runs, wait() times out
    drop_answer,   // runs, its answer is lost: wait() times out
    kill_peer,     // the peer runs `ops_before_death` operations and dies
  };
  // Runs (on the waiting thread) just before the nth message runs at its peer.
  using Hook = std::function<void(size_t nth)>;

  explicit FakeTransport(std::string name, bool one_sided = false);
  ~FakeTransport() override;

  void fail(size_t nth, Fault fault, size_t ops_before_death = 0);
  void before_running(Hook hook);
  // Messages sent (as the asker) and operations they carried.
  size_t messages() const { return m_messages.load(); }
  size_t operations() const { return m_operations.load(); }
  // Marks this transport dead as a peer: its endpoints fail.
  void kill();
  bool dead() const { return m_dead.load(); }

  std::string name() const override { return "fake"; }
  const std::string& address() const override { return m_address; }
  Result<std::unique_ptr<RegisteredRegion>> register_region(void* base, size_t length, MemoryKind kind) override;
  Result<std::shared_ptr<Endpoint>> connect(std::string_view address) override;
  Result<std::shared_ptr<RemoteKey>> unpack(const std::shared_ptr<Endpoint>& endpoint, std::string_view packed_key,
                                            uint64_t base) override;
  bool one_sided(const RemoteKey&) const override { return m_one_sided; }
  std::unique_ptr<TransportBatch> batch() override;
  Status get(TransportBatch& batch, Endpoint& ep, void* dst, size_t length, uint64_t remote_addr, RemoteKey& key) override;
  Status put(TransportBatch& batch, Endpoint& ep, const void* src, size_t length, uint64_t remote_addr,
             RemoteKey& key) override;
  Status atomic(TransportBatch& batch, Endpoint& ep, AtomicOp op, uint64_t operand, uint64_t compare, uint64_t remote_addr,
                RemoteKey& key, uint64_t* result) override;
  Status add_if(TransportBatch& batch, Endpoint& ep, WordCondition condition, uint64_t add, uint64_t undo,
                uint64_t remote_addr, RemoteKey& key, uint64_t* old) override;
  Status persist(TransportBatch& batch, Endpoint& ep, uint64_t remote_addr, size_t length, RemoteKey& key) override;
  Status end_group(TransportBatch& batch, Endpoint& ep, uint64_t* stopped) override;
  Status barrier(TransportBatch& batch, Endpoint& ep, uint64_t* stopped) override;
  Status reserve(TransportBatch& batch, Endpoint& ep, size_t ops, size_t put_bytes, size_t get_bytes) override;
  void send(TransportBatch&) override {}  // messages run at wait()
  Status fence(TransportBatch&, std::chrono::milliseconds) override { return Status(); }
  Status wait(TransportBatch& batch, std::chrono::milliseconds timeout) override;
  Status flush(Endpoint& ep, std::chrono::milliseconds timeout) override;
  bool progress() override { return false; }
  void on_failure(FailureHandler) override {}
  void check_while_waiting(WaitCheck, std::chrono::milliseconds) override {}

 private:
  struct Message;
  class FakeBatch;
  class FakeEndpoint;
  Status add(TransportBatch& batch, Endpoint& ep, const sequence::Op& op, const void* src, void* dst, uint64_t* result);
  // Runs one message at its peer, with the faults asked for.
  Status deliver(Message& m);
  // The first `count` operations of `m`, one by one, as a NIC runs them.
  Status run_one_sided(Message& m, size_t count);

  std::string m_name;
  std::string m_address;
  bool m_one_sided;
  sequence::RegionTable m_regions;
  std::atomic<bool> m_dead{false};
  std::atomic<size_t> m_messages{0};
  std::atomic<size_t> m_operations{0};
  std::mutex m_lock;
  struct Planned {
    Fault fault;
    size_t ops_before_death;
  };
  std::map<size_t, Planned> m_faults;
  Hook m_hook;
};

}  // namespace tiermem::test
