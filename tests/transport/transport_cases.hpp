// The cases every Transport on the message path must pass, run by each
// fabric's test (ucx/ucx_transport_test.cpp, ofi/ofi_transport_test.cpp)
// against a target process that registered a region of k_region bytes
// whose words hold their index.
#pragma once

#include <gtest/gtest.h>

#include <chrono>
#include <cstdio>
#include <numeric>
#include <vector>

#include "transport/transport.hpp"

namespace tiermem::test {

using namespace std::chrono_literals;

// The target's side as the cases see it.
struct TransportCase {
  std::unique_ptr<Transport>& m_transport;
  std::shared_ptr<Endpoint>& m_ep;
  std::shared_ptr<RemoteKey>& m_rkey;
  uint64_t m_base;
  size_t k_region;
};

// Gets, puts and atomics; leaves word 1 at 42 (the target reports it).
inline void get_put_and_atomics_on_a_registered_memfd(const TransportCase& c) {
  auto& [m_transport, m_ep, m_rkey, m_base, k_region] = c;
  auto batch = m_transport->batch();
  // Several gets in flight at once.
  std::vector<uint64_t> words(4096);
  for (size_t i = 0; i < 4; ++i) {
    ASSERT_TRUE(m_transport->get(*batch, *m_ep, words.data() + i * 1024, 8192, m_base + i * 8192, *m_rkey).ok());
  }
  ASSERT_TRUE(m_transport->wait(*batch, 10s).ok());
  for (size_t i = 0; i < words.size(); ++i) ASSERT_EQ(words[i], i);

  std::vector<unsigned char> out(1 << 20), back(1 << 20);
  std::iota(out.begin(), out.end(), 5);
  ASSERT_TRUE(m_transport->put(*batch, *m_ep, out.data(), out.size(), m_base + (4 << 20), *m_rkey).ok());
  ASSERT_TRUE(m_transport->wait(*batch, 10s).ok());
  ASSERT_TRUE(m_transport->flush(*m_ep, 10s).ok());
  ASSERT_TRUE(m_transport->get(*batch, *m_ep, back.data(), back.size(), m_base + (4 << 20), *m_rkey).ok());
  ASSERT_TRUE(m_transport->wait(*batch, 10s).ok());
  EXPECT_EQ(back, out);

  uint64_t old = 0;
  ASSERT_TRUE(m_transport->atomic(*batch, *m_ep, AtomicOp::fetch_add, 10, 0, m_base + 8, *m_rkey, &old).ok());
  ASSERT_TRUE(m_transport->wait(*batch, 10s).ok());
  EXPECT_EQ(old, 1u);
  ASSERT_TRUE(m_transport->atomic(*batch, *m_ep, AtomicOp::compare_swap, 40, 99, m_base + 8, *m_rkey, &old).ok());
  ASSERT_TRUE(m_transport->wait(*batch, 10s).ok());
  EXPECT_EQ(old, 11u) << "compare failed: the word keeps 11";
  ASSERT_TRUE(m_transport->atomic(*batch, *m_ep, AtomicOp::compare_swap, 42, 11, m_base + 8, *m_rkey, &old).ok());
  ASSERT_TRUE(m_transport->wait(*batch, 10s).ok());
  EXPECT_EQ(old, 11u);
  EXPECT_FALSE(m_ep->transports().empty());
  std::printf("transports in use: %s\n", m_ep->transports().c_str());
}

// Over TCP, and over shared memory on memory UCX did not allocate (this
// registered memfd), operations are request/reply messages the target checks:
// a range outside its registered regions, or an unaligned atomic, is refused
// with a reason, and the target goes on serving.
inline void target_refuses_what_is_not_registered(const TransportCase& c) {
  auto& [m_transport, m_ep, m_rkey, m_base, k_region] = c;
  auto batch = m_transport->batch();
  uint64_t word = 0;
  ASSERT_TRUE(m_transport->get(*batch, *m_ep, &word, 16, m_base + k_region - 8, *m_rkey).ok());
  Status s = m_transport->wait(*batch, 10s);
  EXPECT_EQ(s.code(), ErrorCode::out_of_range) << s.to_string();
  EXPECT_NE(s.message().find("not in the registered region"), std::string::npos) << s.message();
  std::vector<unsigned char> bytes(64 << 10, 1);
  ASSERT_TRUE(m_transport->put(*batch, *m_ep, bytes.data(), bytes.size(), m_base - 4096, *m_rkey).ok());
  EXPECT_EQ(m_transport->wait(*batch, 10s).code(), ErrorCode::out_of_range);
  uint64_t old = 0;
  ASSERT_TRUE(m_transport->atomic(*batch, *m_ep, AtomicOp::fetch_add, 1, 0, m_base + 4, *m_rkey, &old).ok());
  s = m_transport->wait(*batch, 10s);
  EXPECT_NE(s.message().find("not 8-byte aligned"), std::string::npos) << s.to_string();
  // Still serving; fenced operations of one batch complete in order.
  uint64_t before = 0, after = 0;
  ASSERT_TRUE(m_transport->get(*batch, *m_ep, &before, 8, m_base + 16, *m_rkey).ok());
  ASSERT_TRUE(m_transport->fence(*batch, 10s).ok());
  ASSERT_TRUE(m_transport->atomic(*batch, *m_ep, AtomicOp::swap, 77, 0, m_base + 16, *m_rkey, &old).ok());
  ASSERT_TRUE(m_transport->fence(*batch, 10s).ok());
  ASSERT_TRUE(m_transport->get(*batch, *m_ep, &after, 8, m_base + 16, *m_rkey).ok());
  ASSERT_TRUE(m_transport->wait(*batch, 10s).ok());
  EXPECT_EQ(before, 2u);
  EXPECT_EQ(old, 2u);
  EXPECT_EQ(after, 77u);
}

// The operations of a batch to one endpoint are one message the target runs
// in order: a compare-and-swap that must succeed and does not stops the rest
// and restores the ones before it.
inline void a_batch_is_one_message_and_a_failed_condition_stops_the_rest(const TransportCase& c) {
  auto& [m_transport, m_ep, m_rkey, m_base, k_region] = c;
  ASSERT_FALSE(m_transport->one_sided(*m_rkey)) << "TCP and shared memory carry operations as messages";
  auto batch = m_transport->batch();
  const uint64_t w = m_base + 1024 * 8;  // words 1024.. hold 1024..
  uint64_t olds[3] = {7, 7, 7};
  uint64_t fresh = 555, after = 0;
  ASSERT_TRUE(m_transport->compare_swap_or_abort(*batch, *m_ep, 1024, 5000, w, *m_rkey, &olds[0]).ok());
  ASSERT_TRUE(m_transport->compare_swap_or_abort(*batch, *m_ep, 1025, 5001, w + 8, *m_rkey, &olds[1]).ok());
  ASSERT_TRUE(m_transport->compare_swap_or_abort(*batch, *m_ep, 9999, 5002, w + 16, *m_rkey, &olds[2]).ok());
  ASSERT_TRUE(m_transport->put(*batch, *m_ep, &fresh, 8, w + 24, *m_rkey).ok());
  Status s = m_transport->wait(*batch, 10s);
  EXPECT_EQ(s.code(), ErrorCode::failed_precondition) << s.to_string();
  EXPECT_EQ(olds[0], 1024u);
  EXPECT_EQ(olds[1], 1025u);
  EXPECT_EQ(olds[2], 1026u) << "the word that failed the condition, as the target saw it";
  std::vector<uint64_t> now(4);
  ASSERT_TRUE(m_transport->get(*batch, *m_ep, now.data(), 32, w, *m_rkey).ok());
  ASSERT_TRUE(m_transport->wait(*batch, 10s).ok());
  EXPECT_EQ(now, (std::vector<uint64_t>{1024, 1025, 1026, 1027})) << "restored, untouched, never written";
  // The same with every condition met: all of it runs.
  ASSERT_TRUE(m_transport->compare_swap_or_abort(*batch, *m_ep, 1024, 5000, w, *m_rkey, &olds[0]).ok());
  ASSERT_TRUE(m_transport->put(*batch, *m_ep, &fresh, 8, w + 24, *m_rkey).ok());
  ASSERT_TRUE(m_transport->get(*batch, *m_ep, &after, 8, w + 24, *m_rkey).ok());
  ASSERT_TRUE(m_transport->wait(*batch, 10s).ok());
  EXPECT_EQ(after, 555u) << "the get after the put in the same message sees it";
}

// Large payloads go by rendezvous: a put staged whole at the target, an
// answer landing in the asker's buffers, scattered over several gets.
inline void large_puts_and_gets_in_one_message_arrive_whole(const TransportCase& c) {
  auto& [m_transport, m_ep, m_rkey, m_base, k_region] = c;
  auto batch = m_transport->batch();
  std::vector<uint64_t> out(512 << 10), other(1024), back(512 << 10), back_other(1024);
  std::iota(out.begin(), out.end(), uint64_t{1} << 40);
  std::iota(other.begin(), other.end(), uint64_t{7} << 40);
  const uint64_t at = m_base + (2 << 20);
  uint64_t before = 0, word = 0;
  ASSERT_TRUE(m_transport->atomic(*batch, *m_ep, AtomicOp::fetch_add, 0, 0, m_base + 16, *m_rkey, &word).ok());
  ASSERT_TRUE(m_transport->get(*batch, *m_ep, &before, 8, at, *m_rkey).ok());
  ASSERT_TRUE(m_transport->put(*batch, *m_ep, out.data(), out.size() * 8, at, *m_rkey).ok());
  ASSERT_TRUE(m_transport->put(*batch, *m_ep, other.data(), other.size() * 8, at + (5 << 20), *m_rkey).ok());
  ASSERT_TRUE(m_transport->wait(*batch, 10s).ok());
  EXPECT_EQ(before, (2u << 20) / 8) << "read before the put of the same message";
  EXPECT_EQ(word, 2u);
  ASSERT_TRUE(m_transport->get(*batch, *m_ep, back_other.data(), back_other.size() * 8, at + (5 << 20), *m_rkey).ok());
  ASSERT_TRUE(m_transport->get(*batch, *m_ep, back.data(), back.size() * 8, at, *m_rkey).ok());
  ASSERT_TRUE(m_transport->wait(*batch, 10s).ok());
  EXPECT_EQ(back, out);
  EXPECT_EQ(back_other, other);
}

// One operation the target must refuse refuses the whole message: the put
// before it in the same batch never runs.
inline void a_message_with_one_bad_operation_is_refused_whole(const TransportCase& c) {
  auto& [m_transport, m_ep, m_rkey, m_base, k_region] = c;
  auto batch = m_transport->batch();
  const uint64_t w = m_base + 2048 * 8;
  uint64_t fresh = 9, word = 0;
  ASSERT_TRUE(m_transport->put(*batch, *m_ep, &fresh, 8, w, *m_rkey).ok());
  ASSERT_TRUE(m_transport->get(*batch, *m_ep, &word, 16, m_base + k_region - 8, *m_rkey).ok());
  Status s = m_transport->wait(*batch, 10s);
  EXPECT_EQ(s.code(), ErrorCode::out_of_range) << s.to_string();
  ASSERT_TRUE(m_transport->get(*batch, *m_ep, &word, 8, w, *m_rkey).ok());
  ASSERT_TRUE(m_transport->persist(*batch, *m_ep, w, 8, *m_rkey).ok());
  ASSERT_TRUE(m_transport->wait(*batch, 10s).ok());
  EXPECT_EQ(word, 2048u) << "the put of the refused message did not run";
}

}  // namespace tiermem::test
