// UcxTransport between two real processes: a target that registers a memfd
// region (as tiermemd does) and an initiator that gets, puts and runs atomics
// on it one-sided. Run once per UCX transport set.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <atomic>
#include <cstdio>
#include <cstring>
#include <numeric>
#include <thread>
#include <vector>

#include "common/frame.hpp"
#include "common/shared_memory.hpp"
#include "transport/transport.hpp"
#include "tests/transport/transport_cases.hpp"

#include <ucp/api/ucp.h>

namespace tiermem {
namespace {

using namespace std::chrono_literals;

constexpr size_t k_region = 8 << 20;

// "listener": over TCP, connected through the target's listener with its
// admission token (as daemons and clients are), not by worker address.
std::string tls_of(const std::string& param) { return param == "listener" ? "tcp" : param; }

// Runs in the child: serves a region until the parent closes the socket.
[[noreturn]] void serve(int sock, const std::string& param) {
  auto t = make_ucx_transport(
      {.tls = tls_of(param), .progress_thread = true, .listen_ip = param == "listener" ? "127.0.0.1" : ""});
  if (!t.ok()) ::_exit(2);
  auto memory = SharedMemory::create("transport-test", k_region);
  auto* words = reinterpret_cast<uint64_t*>(memory->data());
  for (size_t i = 0; i < k_region / 8; ++i) words[i] = i;
  auto region = (*t)->register_region(memory->data(), k_region, MemoryKind::host);
  if (!region.ok()) ::_exit(3);
  std::string hello = (*t)->address();
  hello += std::string(8, '\0');
  const uint64_t base = (*region)->base();
  std::memcpy(hello.data() + (*t)->address().size(), &base, 8);
  const uint32_t alen = static_cast<uint32_t>((*t)->address().size());
  std::string msg(reinterpret_cast<const char*>(&alen), 4);
  msg += hello + (*region)->packed_key();
  if (!wire::send_frame(sock, msg).ok()) ::_exit(4);
  std::string bye;
  (void)wire::recv_frame(sock, 1 << 20, &bye, nullptr);  // until the parent closes
  // Report the final value of word 1 (atomics target) back through the exit code.
  ::_exit(static_cast<int>(words[1] & 0x7f));
}

class UcxTransportTest : public ::testing::TestWithParam<std::string> {
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
    ASSERT_TRUE(wire::recv_frame(m_sock, 1 << 20, &msg, nullptr).ok());
    uint32_t alen;
    std::memcpy(&alen, msg.data(), 4);
    m_address = msg.substr(4, alen);
    std::memcpy(&m_base, msg.data() + 4 + alen, 8);
    m_key = msg.substr(4 + alen + 8);
    auto t = make_ucx_transport({.tls = tls_of(GetParam())});
    ASSERT_TRUE(t.ok()) << t.status().to_string();
    m_transport = std::move(t).value();
    auto ep = m_transport->connect(m_address);
    ASSERT_TRUE(ep.ok()) << ep.status().to_string();
    m_ep = *ep;
    auto key = m_transport->unpack(m_ep, m_key, m_base);
    ASSERT_TRUE(key.ok()) << key.status().to_string();
    m_rkey = *key;
  }

  int finish() {
    m_rkey.reset();
    m_ep.reset();
    m_transport.reset();
    ::close(m_sock);
    int status = 0;
    ::waitpid(m_child, &status, 0);
    return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  }

  test::TransportCase cases() { return {m_transport, m_ep, m_rkey, m_base, k_region}; }

  pid_t m_child = -1;
  int m_sock = -1;
  std::string m_address, m_key;
  uint64_t m_base = 0;
  std::unique_ptr<Transport> m_transport;
  std::shared_ptr<Endpoint> m_ep;
  std::shared_ptr<RemoteKey> m_rkey;
};

TEST_P(UcxTransportTest, GetPutAndAtomicsOnARegisteredMemfd) {
  test::get_put_and_atomics_on_a_registered_memfd(cases());
  EXPECT_EQ(finish(), 42) << "the target saw the swapped value";
}

TEST_P(UcxTransportTest, DeadPeerFailsOperationsInsteadOfHanging) {
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

TEST_P(UcxTransportTest, TargetRefusesWhatIsNotRegistered) {
  test::target_refuses_what_is_not_registered(cases());
}

TEST_P(UcxTransportTest, ABatchIsOneMessageAndAFailedConditionStopsTheRest) {
  test::a_batch_is_one_message_and_a_failed_condition_stops_the_rest(cases());
}

TEST_P(UcxTransportTest, LargePutsAndGetsInOneMessageArriveWhole) {
  test::large_puts_and_gets_in_one_message_arrive_whole(cases());
}

TEST_P(UcxTransportTest, AMessageWithOneBadOperationIsRefusedWhole) {
  test::a_message_with_one_bad_operation_is_refused_whole(cases());
}

TEST_P(UcxTransportTest, AListenerRefusesAConnectionWithoutItsTokenAndServesOthers) {
  if (GetParam() != "listener") GTEST_SKIP() << "listeners only";
  ASSERT_TRUE(is_listener_address(m_address)) << m_address;
  // The same ip and port, another token: a peer that knows where the
  // listener is but was never handed its address.
  std::string guessed = m_address;
  guessed.replace(guessed.size() - 16, 16, guessed.substr(guessed.size() - 16, 15) == "000000000000000"
                                               ? "0000000000000002" : "0000000000000001");
  auto bad = m_transport->connect(guessed);
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), ErrorCode::permission_denied) << bad.status().to_string();
  // A malformed one is said to be malformed.
  auto malformed = m_transport->connect("tmucx-listener 127.0.0.1 notaport");
  EXPECT_EQ(malformed.status().code(), ErrorCode::invalid_argument) << malformed.status().to_string();
  // The admitted connection goes on working, past the admission window of
  // the refused one (which is closed then).
  std::this_thread::sleep_for(2500ms);
  auto batch = m_transport->batch();
  uint64_t word = 0;
  ASSERT_TRUE(m_transport->get(*batch, *m_ep, &word, 8, m_base + 3 * 8, *m_rkey).ok());
  ASSERT_TRUE(m_transport->wait(*batch, 10s).ok());
  EXPECT_EQ(word, 3u);
}

// A connection through the listener that never presents the token (raw
// UCX: no hello at all) is closed by the target when its admission window
// (2 s) ends; the admitted one goes on.
TEST_P(UcxTransportTest, AListenerClosesAConnectionThatNeverSaysHello) {
  if (GetParam() != "listener") GTEST_SKIP() << "listeners only";
  char ip[64] = {};
  unsigned port = 0;
  ASSERT_EQ(std::sscanf(m_address.c_str(), "tmucx-listener %63s %u", ip, &port), 2) << m_address;
  ucp_config_t* config = nullptr;
  ASSERT_EQ(ucp_config_read(nullptr, nullptr, &config), UCS_OK);
  ucp_params_t params{};
  params.field_mask = UCP_PARAM_FIELD_FEATURES;
  params.features = UCP_FEATURE_AM;
  ucp_context_h context = nullptr;
  ASSERT_EQ(ucp_init(&params, config, &context), UCS_OK);
  ucp_config_release(config);
  ucp_worker_params_t wp{};
  ucp_worker_h worker = nullptr;
  ASSERT_EQ(ucp_worker_create(context, &wp, &worker), UCS_OK);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  ASSERT_EQ(::inet_pton(AF_INET, ip, &addr.sin_addr), 1);
  std::atomic<bool> closed{false};
  ucp_ep_params_t ep_params{};
  ep_params.field_mask = UCP_EP_PARAM_FIELD_FLAGS | UCP_EP_PARAM_FIELD_SOCK_ADDR |
                         UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE | UCP_EP_PARAM_FIELD_ERR_HANDLER;
  ep_params.flags = UCP_EP_PARAMS_FLAGS_CLIENT_SERVER;
  ep_params.sockaddr.addr = reinterpret_cast<const sockaddr*>(&addr);
  ep_params.sockaddr.addrlen = sizeof addr;
  ep_params.err_mode = UCP_ERR_HANDLING_MODE_PEER;
  ep_params.err_handler.cb = [](void* arg, ucp_ep_h, ucs_status_t) { static_cast<std::atomic<bool>*>(arg)->store(true); };
  ep_params.err_handler.arg = &closed;
  ucp_ep_h ep = nullptr;
  ASSERT_EQ(ucp_ep_create(worker, &ep_params, &ep), UCS_OK);
  const auto start = std::chrono::steady_clock::now();
  while (!closed.load() && std::chrono::steady_clock::now() - start < 8s) {
    ucp_worker_progress(worker);
    std::this_thread::sleep_for(1ms);
  }
  const auto after = std::chrono::steady_clock::now() - start;
  EXPECT_TRUE(closed.load()) << "the target kept a connection that never presented its token for 8 s";
  EXPECT_GE(after, 1500ms) << "closed before its admission window ended";
  ucp_request_param_t close_params{};
  close_params.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
  close_params.flags = UCP_EP_CLOSE_FLAG_FORCE;
  void* request = ucp_ep_close_nbx(ep, &close_params);
  if (request != nullptr && !UCS_PTR_IS_ERR(request)) {
    while (ucp_request_check_status(request) == UCS_INPROGRESS) ucp_worker_progress(worker);
    ucp_request_free(request);
  }
  ucp_worker_destroy(worker);
  ucp_cleanup(context);
  // The admitted connection is served still.
  auto batch = m_transport->batch();
  uint64_t word = 0;
  ASSERT_TRUE(m_transport->get(*batch, *m_ep, &word, 8, m_base + 5 * 8, *m_rkey).ok());
  ASSERT_TRUE(m_transport->wait(*batch, 10s).ok());
  EXPECT_EQ(word, 5u);
}

INSTANTIATE_TEST_SUITE_P(Transports, UcxTransportTest, ::testing::Values("tcp", "sm", "listener"),
                         [](const auto& info) { return info.param; });

}  // namespace
}  // namespace tiermem
