// SpinPolicy and serving_spin, as a client and its daemon use them: a model
// of one client doing back-to-back requests against one serving thread, with
// the times measured on the development VM (remote_bench tcp): a round trip
// whose both ends poll costs 15 us; a thread that slept costs 80 us more to
// wake. The model runs the same SpinPolicy code the transports run.
#include <gtest/gtest.h>

#include <chrono>

#include "transport/wait_policy.hpp"

namespace tiermem::transport_detail {
namespace {

using namespace std::chrono_literals;
using ns = std::chrono::nanoseconds;

constexpr ns k_transit = 5us;   // one way, both ends awake
constexpr ns k_handle = 5us;    // the server's work on a request
constexpr ns k_wake = 80us;     // a sleeping thread's wake-up

struct Pair {
  SpinPolicy client;
  SpinPolicy server;
  ns round_trip{0};
};

// One request: the server waits (its idle gap) for the request, then the
// client waits for the answer. Returns the client's round trip.
ns one_request(Pair& p, ns client_gap_to_next) {
  // The server's gap runs from its last answer: the answer's transit, the
  // client's wake-up if it slept on it, the client's next request.
  const ns server_budget = p.server.budget();
  const ns client_budget = p.client.budget();
  const bool client_sleeps = p.round_trip > client_budget;
  const ns gap = k_transit + (client_sleeps ? k_wake : ns{0}) + client_gap_to_next + k_transit;
  const bool server_sleeps = gap > server_budget;
  // A server that slept sees its own wake-up too.
  p.server.record(gap + (server_sleeps ? k_wake : ns{0}), std::min(gap, server_budget), server_sleeps);
  // The client's wait: transit, the server's wake-up if it slept, the work,
  // transit back.
  const ns answer = k_transit + (server_sleeps ? k_wake : ns{0}) + k_handle + k_transit;
  const bool sleeps = answer > client_budget;
  const ns took = answer + (sleeps ? k_wake : ns{0});
  p.client.record(took, std::min(answer, client_budget), sleeps);
  p.round_trip = answer;
  return took;
}

// Both ends start having learnt that polling does not pay (as after a run of
// large transfers, whose gaps outlast any poll).
void teach_sleeping(SpinPolicy& s) {
  for (int i = 0; i < 20; ++i) s.record(1ms, s.limit(), true);
}

ns settled_round_trip(ns client_limit, ns server_limit) {
  Pair p{SpinPolicy(client_limit), SpinPolicy(server_limit)};
  teach_sleeping(p.client);
  teach_sleeping(p.server);
  ns took{0};
  for (int i = 0; i < 2000; ++i) took = one_request(p, 1us);
  // The median of the last 64 would be as good: the model has no noise, the
  // last request shows where the pair settled.
  return took;
}

TEST(WaitPolicy, ServingSpinIsFourTimesTheWaitersAndZeroStaysZero) {
  EXPECT_EQ(serving_spin(30us), ns(120us));
  EXPECT_EQ(serving_spin(0us), ns(0));
}

TEST(WaitPolicy, WithEqualLimitsAPairThatLearntToSleepStaysAsleep) {
  // The failure serving_spin is for: each end's probes meet the other
  // asleep, so neither sees polling pay (8-byte gets at 100+ us).
  EXPECT_GE(settled_round_trip(30us, 30us), k_wake);
}

TEST(WaitPolicy, AServerPollingThroughASleepingClientsRoundTripBringsThePairToPolling) {
  const ns took = settled_round_trip(30us, serving_spin(30us));
  EXPECT_LT(took, 30us) << "the pair should settle with both ends polling (a 15 us round trip)";
}

TEST(WaitPolicy, ABusyHostStopsThePolling) {
  // Every wait outlasts the poll (the peer is descheduled): polling stops,
  // but for one probe in 32.
  SpinPolicy s(120us);
  for (int i = 0; i < 16; ++i) s.record(5ms, s.budget(), true);
  int polls = 0;
  for (int i = 0; i < 64; ++i) {
    const ns b = s.budget();
    if (b.count() > 0) ++polls;
    s.record(5ms, b, true);
  }
  EXPECT_LE(polls, 2);
}

}  // namespace
}  // namespace tiermem::transport_detail
