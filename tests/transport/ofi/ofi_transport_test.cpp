// The libfabric transport between two real processes, per provider that
// works here (shm; tcp;ofi_rxm on 127.0.0.1): a target that registers a memfd
// region (as tiermemd does) and serves it from its progress thread, and an
// initiator that gets, puts and runs atomics on it. The same cases as
// ucx_transport_test.cpp, and what libfabric brings of its own: a peer killed
// mid-operation, a provider without what tiermem needs.
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <algorithm>
#include <numeric>
#include <thread>
#include <vector>

#include "common/frame.hpp"
#include "common/shared_memory.hpp"
#include "transport/ofi/ofi_shm_files.hpp"
#include "transport/transport.hpp"
#include "tests/transport/transport_cases.hpp"

namespace tiermem {
namespace {

using namespace std::chrono_literals;

constexpr size_t k_region = 8 << 20;

// "shm", "tcp": the message path; "shm-rma", "tcp-rma": the one-sided path,
// forced on providers that do not check keys (OfiOptions::one_sided
// "unchecked"), which is how it is exercised without EFA, verbs or cxi.
bool is_rma(const std::string& param) { return param.ends_with("-rma"); }

OfiOptions options_of(const std::string& param, bool progress_thread) {
  OfiOptions o;
  const std::string base = param.substr(0, param.find('-'));
  o.provider = base == "tcp" ? "tcp;ofi_rxm" : base;
  o.one_sided = is_rma(param) ? "unchecked" : "auto";
  o.progress_thread = progress_thread;
  o.listen_ip = base == "tcp" ? "127.0.0.1" : "";
  return o;
}

// Runs in the child: serves a region until the parent closes the socket.
[[noreturn]] void serve(int sock, const std::string& param) {
  auto t = make_ofi_transport(options_of(param, true));
  if (!t.ok()) ::_exit(2);
  auto memory = SharedMemory::create("ofi-transport-test", k_region);
  auto* words = reinterpret_cast<uint64_t*>(memory->data());
  for (size_t i = 0; i < k_region / 8; ++i) words[i] = i;
  auto region = (*t)->register_region(memory->data(), k_region, MemoryKind::host);
  if (!region.ok()) ::_exit(3);
  const std::string address = (*t)->address();
  const uint64_t base = (*region)->base();
  const uint32_t alen = static_cast<uint32_t>(address.size());
  std::string msg(reinterpret_cast<const char*>(&alen), 4);
  msg += address + std::string(reinterpret_cast<const char*>(&base), 8) + (*region)->packed_key();
  if (!wire::send_frame(sock, msg).ok()) ::_exit(4);
  std::string bye;
  (void)wire::recv_frame(sock, 1 << 20, &bye, nullptr);  // until the parent closes
  // Report the final value of word 1 (atomics target) back through the exit
  // code, having closed the transport (shm removes its queue then).
  const int code = static_cast<int>(words[1] & 0x7f);
  region->reset();
  t->reset();
  ::_exit(code);
}

class OfiTransportTest : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    int sv[2];
    ASSERT_EQ(::socketpair(AF_UNIX, SOCK_STREAM, 0, sv), 0);
    m_child = ::fork();
    if (m_child == 0) {
      ::close(sv[0]);
      serve(sv[1], GetParam());
    }
    ::close(sv[1]);
    m_sock = sv[0];
    std::string msg;
    ASSERT_TRUE(wire::recv_frame(m_sock, 1 << 20, &msg, nullptr).ok()) << "the target did not start";
    uint32_t alen;
    std::memcpy(&alen, msg.data(), 4);
    m_address = msg.substr(4, alen);
    std::memcpy(&m_base, msg.data() + 4 + alen, 8);
    m_key = msg.substr(4 + alen + 8);
    ASSERT_TRUE(is_ofi_address(m_address)) << m_address;
    auto t = make_ofi_transport(options_of(GetParam(), false));
    ASSERT_TRUE(t.ok()) << t.status().to_string();
    m_transport = std::move(t).value();
    auto ep = m_transport->connect(m_address);
    ASSERT_TRUE(ep.ok()) << ep.status().to_string();
    m_ep = *ep;
    auto key = m_transport->unpack(m_ep, m_key, m_base);
    ASSERT_TRUE(key.ok()) << key.status().to_string();
    m_rkey = *key;
    ASSERT_EQ(m_transport->one_sided(*m_rkey), is_rma(GetParam())) << m_ep->transports();
  }

  // The one-sided path: cases of what only messages do (conditions,
  // refusals by the target's check, order within a batch without fences)
  // are skipped.
  bool rma() const { return is_rma(GetParam()); }

  void TearDown() override {
    if (m_child > 0) {
      ::kill(m_child, SIGKILL);
      ::waitpid(m_child, nullptr, 0);
      m_killed = m_child;
    }
    // shm keeps an endpoint's queue in /dev/shm/<pid>:...; a killed target
    // could not remove its own.
    if (m_killed > 0) {
      const std::string prefix = std::to_string(m_killed) + ":";
      for (const auto& f : std::filesystem::directory_iterator("/dev/shm")) {
        if (f.path().filename().string().starts_with(prefix)) std::filesystem::remove(f.path());
      }
    }
  }

  int finish() {
    m_rkey.reset();
    m_ep.reset();
    m_transport.reset();
    ::close(m_sock);
    int status = 0;
    ::waitpid(m_child, &status, 0);
    m_child = -1;
    return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  }

  test::TransportCase cases() { return {m_transport, m_ep, m_rkey, m_base, k_region}; }

  pid_t m_child = -1;
  pid_t m_killed = -1;  // a target killed by the test
  int m_sock = -1;
  std::string m_address, m_key;
  uint64_t m_base = 0;
  std::unique_ptr<Transport> m_transport;
  std::shared_ptr<Endpoint> m_ep;
  std::shared_ptr<RemoteKey> m_rkey;
};

TEST_P(OfiTransportTest, GetPutAndAtomicsOnARegisteredMemfd) {
  test::get_put_and_atomics_on_a_registered_memfd(cases());
  EXPECT_EQ(finish(), 42) << "the target saw the swapped value";
}

TEST_P(OfiTransportTest, DeadPeerFailsOperationsInsteadOfHanging) {
  m_killed = m_child;
  ::kill(m_child, SIGKILL);
  int status = 0;
  ::waitpid(m_child, &status, 0);
  m_child = -1;
  auto batch = m_transport->batch();
  uint64_t word = 0;
  Status s;
  // The failure surfaces on the first operation or within a few.
  for (int i = 0; i < 50 && s.ok(); ++i) {
    s = m_transport->get(*batch, *m_ep, &word, 8, m_base, *m_rkey);
    if (s.ok()) s = m_transport->wait(*batch, 3s);
  }
  EXPECT_FALSE(s.ok());
  m_rkey.reset();
  m_ep.reset();
  ::close(m_sock);
}

TEST_P(OfiTransportTest, TargetRefusesWhatIsNotRegistered) {
  if (rma()) GTEST_SKIP() << "what only messages do";
  test::target_refuses_what_is_not_registered(cases());
}

TEST_P(OfiTransportTest, ABatchIsOneMessageAndAFailedConditionStopsTheRest) {
  if (rma()) GTEST_SKIP() << "what only messages do";
  test::a_batch_is_one_message_and_a_failed_condition_stops_the_rest(cases());
}

TEST_P(OfiTransportTest, LargePutsAndGetsInOneMessageArriveWhole) {
  if (rma()) GTEST_SKIP() << "what only messages do";
  test::large_puts_and_gets_in_one_message_arrive_whole(cases());
}

TEST_P(OfiTransportTest, AMessageWithOneBadOperationIsRefusedWhole) {
  if (rma()) GTEST_SKIP() << "what only messages do";
  test::a_message_with_one_bad_operation_is_refused_whole(cases());
}

// A peer killed while a batch of large gets and a conditional add waits on
// it: the wait ends with an error soon after (tcp reports the broken
// connection; shm reports nothing, and the peer's process is watched), and
// nothing lands in the caller's buffers afterwards (answers land in the
// transport's own staging).
TEST_P(OfiTransportTest, APeerKilledMidOperationFailsTheWaitAndWritesNothingLater) {
  if (rma()) GTEST_SKIP() << "has a conditional add: messages only";
  m_killed = m_child;
  ::kill(m_child, SIGSTOP);  // the requests arrive; nobody answers them
  auto batch = m_transport->batch();
  constexpr size_t k_get = 1 << 20;
  std::vector<std::vector<unsigned char>> dst(8, std::vector<unsigned char>(k_get + 64, 0xee));
  for (size_t i = 0; i < dst.size(); ++i) {
    ASSERT_TRUE(m_transport->get(*batch, *m_ep, dst[i].data(), k_get, m_base + i * k_get / 2, *m_rkey).ok());
  }
  uint64_t old = 0xeeee;
  ASSERT_TRUE(m_transport->add_if(*batch, *m_ep, {~uint64_t{0}, 3}, 1, ~uint64_t{0}, m_base + 24, *m_rkey, &old).ok());
  std::thread killer([&] {
    std::this_thread::sleep_for(200ms);
    ::kill(m_child, SIGKILL);
  });
  const auto start = std::chrono::steady_clock::now();
  Status s = m_transport->wait(*batch, 20s);
  const auto took = std::chrono::steady_clock::now() - start;
  killer.join();
  EXPECT_FALSE(s.ok());
  EXPECT_EQ(s.code(), ErrorCode::transport_error) << s.to_string();
  EXPECT_LT(took, 5s) << "failure noticed after " << std::chrono::duration_cast<std::chrono::milliseconds>(took).count()
                      << " ms: " << s.to_string();
  EXPECT_TRUE(m_ep->failed());
  std::this_thread::sleep_for(500ms);
  for (int i = 0; i < 20; ++i) m_transport->progress();
  for (const auto& d : dst) {
    for (unsigned char c : d) ASSERT_EQ(c, 0xee) << "a byte landed in the caller's buffer after the wait";
  }
  EXPECT_EQ(old, 0xeeeeu);
  ::waitpid(m_child, nullptr, 0);
  m_child = -1;
}

// A peer that does not present the admission token of the address it was
// given is refused (and runs nothing); the target goes on serving others.
TEST_P(OfiTransportTest, AConnectionWithoutTheTokenIsRefusedAndOthersAreServed) {
  std::string forged = m_address;
  // The token is the third word of the address.
  const size_t a = forged.find(' ', forged.find(' ') + 1) + 1;
  forged[a] = forged[a] == '1' ? '2' : '1';
  auto t = make_ofi_transport(options_of(GetParam(), false));
  ASSERT_TRUE(t.ok());
  auto ep = (*t)->connect(forged);
  ASSERT_FALSE(ep.ok());
  EXPECT_EQ(ep.status().code(), ErrorCode::permission_denied) << ep.status().to_string();
  auto batch = m_transport->batch();
  uint64_t word = 0;
  ASSERT_TRUE(m_transport->get(*batch, *m_ep, &word, 8, m_base + 40, *m_rkey).ok());
  ASSERT_TRUE(m_transport->wait(*batch, 10s).ok());
  EXPECT_EQ(word, 5u);
}

// The one-sided path: fenced operations in order, large ones whole, and what
// needs the target's CPU refused on its keys.
TEST_P(OfiTransportTest, OneSidedOperationsAreOrderedByFencesAndRefuseWhatNeedsMessages) {
  if (!is_rma(GetParam())) GTEST_SKIP() << "one-sided only";
  auto batch = m_transport->batch();
  std::vector<uint64_t> out(256 << 10), back(256 << 10);
  std::iota(out.begin(), out.end(), uint64_t{3} << 40);
  const uint64_t at = m_base + (2 << 20);
  uint64_t old = 0;
  ASSERT_TRUE(m_transport->put(*batch, *m_ep, out.data(), out.size() * 8, at, *m_rkey).ok());
  ASSERT_TRUE(m_transport->fence(*batch, 10s).ok());
  ASSERT_TRUE(m_transport->atomic(*batch, *m_ep, AtomicOp::fetch_add, 5, 0, at, *m_rkey, &old).ok());
  ASSERT_TRUE(m_transport->fence(*batch, 10s).ok());
  ASSERT_TRUE(m_transport->get(*batch, *m_ep, back.data(), back.size() * 8, at, *m_rkey).ok());
  ASSERT_TRUE(m_transport->wait(*batch, 10s).ok());
  EXPECT_EQ(old, out[0]) << "the atomic after the fence saw the put";
  out[0] += 5;
  EXPECT_EQ(back, out);
  uint64_t word = 0;
  EXPECT_EQ(m_transport->add_if(*batch, *m_ep, {}, 1, 1, at, *m_rkey, &word).code(), ErrorCode::not_supported);
  EXPECT_EQ(m_transport->persist(*batch, *m_ep, at, 8, *m_rkey).code(), ErrorCode::not_supported);
  EXPECT_NE(m_ep->transports().find("one-sided"), std::string::npos) << m_ep->transports();
}

INSTANTIATE_TEST_SUITE_P(Providers, OfiTransportTest, ::testing::Values("shm", "tcp", "shm-rma", "tcp-rma"),
                         [](const auto& info) {
                           std::string n = info.param;
                           std::replace(n.begin(), n.end(), '-', '_');
                           return n;
                         });

// A provider that is not there, or offers no reliable tagged messages, is
// refused with its name and the providers there are.
TEST(OfiTransport, AProviderWithoutWhatTiermemNeedsIsRefusedWithTheReason) {
  for (const char* provider : {"psm2", "no-such-provider"}) {
    OfiOptions o;
    o.provider = provider;
    auto t = make_ofi_transport(o);
    ASSERT_FALSE(t.ok()) << provider;
    EXPECT_EQ(t.status().code(), ErrorCode::not_supported) << t.status().to_string();
    EXPECT_NE(t.status().message().find(provider), std::string::npos) << t.status().to_string();
    EXPECT_NE(t.status().message().find("providers here"), std::string::npos) << t.status().to_string();
  }
  OfiOptions none;
  none.provider = "";
  EXPECT_EQ(make_ofi_transport(none).status().code(), ErrorCode::invalid_argument);
}

TEST(OfiTransport, AddressesNameTheirProvider) {
  OfiOptions o;
  o.provider = "shm";
  auto t = make_ofi_transport(o);
  ASSERT_TRUE(t.ok()) << t.status().to_string();
  EXPECT_TRUE(is_ofi_address((*t)->address()));
  EXPECT_EQ(ofi_provider_of((*t)->address()), "shm");
  EXPECT_EQ((*t)->name(), "libfabric/shm");
  EXPECT_FALSE(is_ofi_address("ucx worker address"));
  // A daemon passes its listen IP whatever the provider; shm does not
  // address by IP and must not name its queue after it: two processes of
  // one host would share one (the second crashed inside libfabric).
  o.listen_ip = "127.0.0.1";
  auto a = make_ofi_transport(o);
  ASSERT_TRUE(a.ok()) << a.status().to_string();
  const pid_t child = ::fork();
  if (child == 0) {
    const bool ok = make_ofi_transport(o).ok();  // closed before _exit: shm removes its queue
    ::_exit(ok ? 0 : 1);
  }
  int status = 0;
  ::waitpid(child, &status, 0);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "a second process's shm transport: " << status;
  // A peer of another provider is refused by name, not dialled.
  o.provider = "tcp;ofi_rxm";
  o.listen_ip = "127.0.0.1";
  auto tcp = make_ofi_transport(o);
  ASSERT_TRUE(tcp.ok()) << tcp.status().to_string();
  auto ep = (*tcp)->connect((*t)->address());
  ASSERT_FALSE(ep.ok());
  EXPECT_NE(ep.status().message().find("provider shm"), std::string::npos) << ep.status().to_string();
}

// tcp;ofi_rxm's receive pool is sized down before libfabric reads its
// parameters (200 ms and ~50 MiB per endpoint at its default), unless the
// operator set it.
TEST(OfiTransport, RxmReceivePoolIsSizedDownUnlessTheOperatorSetIt) {
  const char* before = std::getenv("FI_OFI_RXM_MSG_RX_SIZE");
  const std::string operators = before != nullptr ? before : "";
  OfiOptions o;
  o.provider = "tcp;ofi_rxm";
  o.listen_ip = "127.0.0.1";
  auto t = make_ofi_transport(o);
  ASSERT_TRUE(t.ok()) << t.status().to_string();
  const char* now = std::getenv("FI_OFI_RXM_MSG_RX_SIZE");
  ASSERT_NE(now, nullptr);
  EXPECT_EQ(std::string(now), operators.empty() ? "128" : operators);
}

// The queues of /dev/shm that name `pid` (ofi_shm_files.hpp).
std::vector<std::string> queues_of(pid_t pid) {
  std::vector<std::string> found;
  for (const auto& f : std::filesystem::directory_iterator("/dev/shm")) {
    if (ofi_detail::pid_of_shm_queue(f.path().filename().string()) == pid) found.push_back(f.path().filename());
  }
  return found;
}

// A process killed by SIGKILL leaves its shm queue in /dev/shm (16 MiB);
// the sweep every shm transport makes removes it, and nothing of a live
// process or of another name.
TEST(OfiTransport, QueuesOfKilledProcessesAreSweptAndNothingElse) {
  OfiOptions o;
  o.provider = "shm";
  auto mine = make_ofi_transport(o);
  ASSERT_TRUE(mine.ok()) << mine.status().to_string();
  int ready[2];
  ASSERT_EQ(::pipe(ready), 0);
  const pid_t child = ::fork();
  if (child == 0) {
    auto t = make_ofi_transport(o);
    (void)!::write(ready[1], t.ok() ? "y" : "n", 1);
    ::pause();
    ::_exit(0);
  }
  ::close(ready[1]);
  char said = 0;
  ASSERT_EQ(::read(ready[0], &said, 1), 1);
  ::close(ready[0]);
  ASSERT_EQ(said, 'y');
  ::kill(child, SIGKILL);
  ::waitpid(child, nullptr, 0);
  ASSERT_FALSE(queues_of(child).empty()) << "shm removed a killed process's queue itself: nothing to sweep";
  ASSERT_FALSE(queues_of(::getpid()).empty());
  const ofi_detail::ShmSweep swept = ofi_detail::sweep_dead_shm_queues("/dev/shm");
  EXPECT_GE(swept.files, 1u);
  EXPECT_TRUE(queues_of(child).empty()) << "the killed process's queue is still there";
  EXPECT_FALSE(queues_of(::getpid()).empty()) << "a live process's queue was removed";
  // Only names of the queue pattern, of this user, of dead pids.
  const std::string dir = ::testing::TempDir() + "/shm-sweep-" + std::to_string(::getpid());
  std::filesystem::create_directories(dir);
  const std::string dead = std::to_string(child), me = std::to_string(::getpid());
  const std::string hex(32, 'a');
  for (const std::string& name : {dead + ":0:0", "tm-" + dead + "-" + hex, dead + ":0:0.bak", dead + ":x:0",
                                  "tm-" + dead + "-" + hex + "x", std::string("notaqueue"), me + ":1:2",
                                  "tm-" + me + "-" + hex}) {
    std::FILE* f = std::fopen((dir + "/" + name).c_str(), "w");
    ASSERT_NE(f, nullptr) << name;
    std::fclose(f);
  }
  std::filesystem::create_directory(dir + "/" + dead + ":1:1");  // not a file
  EXPECT_EQ(ofi_detail::sweep_dead_shm_queues(dir).files, 2u);
  EXPECT_FALSE(std::filesystem::exists(dir + "/" + dead + ":0:0"));
  EXPECT_FALSE(std::filesystem::exists(dir + "/tm-" + dead + "-" + hex));
  for (const std::string& kept : {dead + ":0:0.bak", dead + ":x:0", "tm-" + dead + "-" + hex + "x",
                                  std::string("notaqueue"), me + ":1:2", "tm-" + me + "-" + hex, dead + ":1:1"}) {
    EXPECT_TRUE(std::filesystem::exists(dir + "/" + kept)) << kept << " was removed";
  }
  std::filesystem::remove_all(dir);
}

// shm queue names cannot be guessed: each is this process's pid and 128
// random bits, and a transport's own queue is one of them.
TEST(OfiTransport, ShmQueueNamesAreOurOwnAndUnpredictable) {
  auto a = ofi_detail::fresh_shm_queue_name();
  auto b = ofi_detail::fresh_shm_queue_name();
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_NE(*a, *b);
  EXPECT_EQ(ofi_detail::pid_of_shm_queue(*a), ::getpid()) << *a;
  EXPECT_EQ(a->size(), std::string("fi_shm://tm-").size() + std::to_string(::getpid()).size() + 1 + 32) << *a;
  EXPECT_EQ(ofi_detail::pid_of_shm_queue("fi_shm://123:0:4"), 123);
  EXPECT_EQ(ofi_detail::pid_of_shm_queue("tm-123-xyz"), 0);
  EXPECT_EQ(ofi_detail::pid_of_shm_queue("../123:0:4"), 0);
  OfiOptions o;
  o.provider = "shm";
  auto t = make_ofi_transport(o);
  ASSERT_TRUE(t.ok()) << t.status().to_string();
  EXPECT_NE((*t)->address().find(" " + std::to_string(::getpid()) + " "), std::string::npos);
  bool found = false;
  for (const auto& f : std::filesystem::directory_iterator("/dev/shm")) {
    const std::string name = f.path().filename().string();
    found |= name.starts_with("tm-" + std::to_string(::getpid()) + "-");
  }
  EXPECT_TRUE(found) << "no queue of this process named tm-<pid>-<random>";
}

// A peer address naming a queue file that is not a queue of this user, or
// is open to others, or is too short to hold one, or is not a regular file,
// is refused before the provider maps anything: not_supported, naming the
// file and its owner; never SIGBUS. A queue that does not exist is a peer
// that is gone: connection_failed (its node is down; a reader turns to its
// copies), not a refusal.
TEST(OfiTransport, PeerQueuesThatFailTheirChecksAreRefusedNotMapped) {
  OfiOptions o;
  o.provider = "shm";
  auto t = make_ofi_transport(o);
  ASSERT_TRUE(t.ok()) << t.status().to_string();
  const std::string stem = "tm-" + std::to_string(::getpid()) + "-check";
  struct Case {
    std::string name;
    std::string why;
    ErrorCode code = ErrorCode::not_supported;
  };
  std::vector<Case> cases = {{stem + "-empty", "bytes, too few"},
                             {stem + "-open", "open to other users"},
                             {stem + "-fifo", "not a regular file"},
                             {stem + "-link", "cannot be opened"},
                             {stem + "-theirs", "belongs to another user"},
                             {stem + "-missing", "does not exist", ErrorCode::connection_failed}};
  const std::string dir = "/dev/shm/";
  { std::ofstream(dir + cases[0].name); }
  ::chmod((dir + cases[0].name).c_str(), 0600);
  { std::ofstream(dir + cases[1].name); }
  ::truncate((dir + cases[1].name).c_str(), 16 << 20);
  ::chmod((dir + cases[1].name).c_str(), 0666);
  ASSERT_EQ(::mkfifo((dir + cases[2].name).c_str(), 0600), 0);
  ASSERT_EQ(::symlink((dir + cases[1].name).c_str(), (dir + cases[3].name).c_str()), 0);
  { std::ofstream(dir + cases[4].name); }
  ::truncate((dir + cases[4].name).c_str(), 16 << 20);
  ::chmod((dir + cases[4].name).c_str(), 0600);
  const bool root = ::geteuid() == 0;
  if (root) {
    ASSERT_EQ(::chown((dir + cases[4].name).c_str(), 65534, 65534), 0);
  }
  for (const Case& c : cases) {
    if (!root && c.name.ends_with("-theirs")) {
      continue;
    }
    std::string hex_name;
    const std::string full = "fi_shm://" + c.name;
    for (unsigned char ch : full + std::string(1, '\0')) {
      static constexpr char k_hex[] = "0123456789abcdef";
      hex_name += k_hex[ch >> 4];
      hex_name += k_hex[ch & 15];
    }
    const std::string address = "tmofi1 shm 1 " + std::to_string(::getpid()) + " " + hex_name;
    auto ep = (*t)->connect(address);
    ASSERT_FALSE(ep.ok()) << c.name;
    EXPECT_EQ(ep.status().code(), c.code) << ep.status().to_string();
    EXPECT_NE(ep.status().message().find(dir + c.name), std::string::npos) << ep.status().to_string();
    EXPECT_NE(ep.status().message().find(c.why), std::string::npos) << ep.status().to_string();
  }
  for (const Case& c : cases) std::filesystem::remove(dir + c.name);
}

// How many of this process's mappings are of queues of `pid`.
int queues_mapped(pid_t pid) {
  std::ifstream maps("/proc/self/maps");
  int n = 0;
  for (std::string line; std::getline(maps, line);) {
    const size_t at = line.find("/dev/shm/");
    if (at == std::string::npos) continue;
    const std::string name = line.substr(at + 9, line.find(' ', at) - at - 9);  // without " (deleted)"
    n += ofi_detail::pid_of_shm_queue(name) == pid ? 1 : 0;
  }
  return n;
}

// shm maps the queue of every asker that said hello; an asker that exited
// is forgotten (its address removed, its queue unmapped: the memory of a
// queue is held as long as anyone maps it) within k_dead_asker_grace plus a
// sweep, and a live one is kept and served. The askers are forked before
// the target's progress thread starts (a fork of a process with fabric
// threads is no process to test with) and told where it is by a pipe.
TEST(OfiTransport, AskersThatExitedAreUnmappedAndLiveOnesServed) {
  struct Asker {
    pid_t pid = -1;
    int said = -1, go = -1;
  };
  auto start_asker = []() -> Asker {
    int up[2], down[2];
    if (::pipe(up) != 0 || ::pipe(down) != 0) return {};
    const pid_t pid = ::fork();
    if (pid == 0) {
      ::close(up[0]);
      ::close(down[1]);
      // The target: its address, region base and packed key, each after
      // its length.
      auto field = [&] {
        uint32_t n = 0;
        std::string f;
        if (::read(down[0], &n, 4) != 4 || n > 4096) return f;
        f.resize(n);
        size_t got = 0;
        while (got < n) {
          const ssize_t r = ::read(down[0], f.data() + got, n - got);
          if (r <= 0) break;
          got += static_cast<size_t>(r);
        }
        return f;
      };
      const std::string address = field(), base_bytes = field(), packed = field();
      uint64_t base = 0;
      std::memcpy(&base, base_bytes.data(), std::min<size_t>(8, base_bytes.size()));
      OfiOptions mine;
      mine.provider = "shm";
      auto t = make_ofi_transport(mine);
      auto read_once = [&]() -> char {
        if (!t.ok()) return 'n';
        auto ep = (*t)->connect(address);
        if (!ep.ok()) return 'c';
        auto key = (*t)->unpack(*ep, packed, base);
        if (!key.ok()) return 'k';
        unsigned char byte = 0;
        auto batch = (*t)->batch();
        Status s = (*t)->get(*batch, **ep, &byte, 1, base, **key);
        if (s.ok()) s = (*t)->wait(*batch, std::chrono::seconds(5));
        return s.ok() && byte == 7 ? 'y' : 'r';
      };
      char r = read_once();
      (void)!::write(up[1], &r, 1);
      char go = 0;
      while (::read(down[0], &go, 1) == 1) {
        r = read_once();
        (void)!::write(up[1], &r, 1);
      }
      ::_exit(0);
    }
    ::close(up[1]);
    ::close(down[0]);
    return {pid, up[0], down[1]};
  };
  std::vector<Asker> askers;
  for (int i = 0; i < 5; ++i) {
    askers.push_back(start_asker());
    ASSERT_GT(askers.back().pid, 0);
  }
  OfiOptions o;
  o.provider = "shm";
  o.progress_thread = true;
  auto target = make_ofi_transport(o);
  ASSERT_TRUE(target.ok()) << target.status().to_string();
  auto memory = SharedMemory::create("ofi-askers-test", 4096);
  ASSERT_TRUE(memory.ok());
  std::memset(memory->data(), 7, 4096);
  auto region = (*target)->register_region(memory->data(), 4096, MemoryKind::host);
  ASSERT_TRUE(region.ok());
  const uint64_t base = (*region)->base();
  auto send_field = [](int fd, const std::string& f) {
    const uint32_t n = static_cast<uint32_t>(f.size());
    return ::write(fd, &n, 4) == 4 && ::write(fd, f.data(), f.size()) == static_cast<ssize_t>(f.size());
  };
  auto said = [](const Asker& a) {
    char r = 0;
    return ::read(a.said, &r, 1) == 1 ? r : '?';
  };
  for (const Asker& a : askers) {
    ASSERT_TRUE(send_field(a.go, (*target)->address()) &&
                send_field(a.go, std::string(reinterpret_cast<const char*>(&base), 8)) &&
                send_field(a.go, (*region)->packed_key()));
    EXPECT_EQ(said(a), 'y') << "an asker was not served";
  }
  // The first lives on; the others are killed.
  const Asker live = askers.front();
  std::vector<pid_t> killed;
  for (size_t i = 1; i < askers.size(); ++i) {
    ::kill(askers[i].pid, SIGKILL);
    ::waitpid(askers[i].pid, nullptr, 0);
    ::close(askers[i].said);
    ::close(askers[i].go);
    killed.push_back(askers[i].pid);
  }
  for (pid_t pid : killed) EXPECT_GT(queues_mapped(pid), 0) << "shm did not map an asker's queue: nothing to test";
  auto any_mapped = [&] {
    int n = 0;
    for (pid_t pid : killed) n += queues_mapped(pid);
    return n;
  };
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  while (any_mapped() > 0 && std::chrono::steady_clock::now() < until) {
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
  }
  EXPECT_EQ(any_mapped(), 0) << "the queues of askers that exited are still mapped";
  EXPECT_GT(queues_mapped(live.pid), 0) << "a live asker's queue was unmapped";
  // Served again and again, each time after a hello of its own: the target
  // watches the process with one descriptor, not one per hello.
  const auto descriptors = [] {
    return std::distance(std::filesystem::directory_iterator("/proc/self/fd"), std::filesystem::directory_iterator{});
  };
  const auto before = descriptors();
  for (int i = 0; i < 50; ++i) {
    ASSERT_EQ(::write(live.go, "g", 1), 1);
    ASSERT_EQ(said(live), 'y') << "the live asker is not served any more (hello " << i << ")";
  }
  EXPECT_LT(descriptors() - before, 5) << "a descriptor per hello";
  ::close(live.go);
  ::waitpid(live.pid, nullptr, 0);
  ::close(live.said);
  (void)ofi_detail::sweep_dead_shm_queues("/dev/shm");
}

}  // namespace
}  // namespace tiermem
