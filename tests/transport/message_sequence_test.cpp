// The target side of a message (transport/message_sequence): a message is
// checked whole before any of it runs, then run in order; a conditional add
// whose condition fails stops it and undoes the conditional adds before it.
#include "transport/message_sequence.hpp"

#include <gtest/gtest.h>

#include <cstring>
#include <numeric>
#include <vector>

namespace tiermem::sequence {
namespace {

class MessageSequenceTest : public ::testing::Test {
 protected:
  MessageSequenceTest() : m_memory(64) {
    std::iota(m_memory.begin(), m_memory.end(), 0);
    m_regions.add(base(), m_memory.size() * 8, MemoryKind::host, k_token);
  }
  uint64_t base() { return reinterpret_cast<uint64_t>(m_memory.data()); }
  uint64_t word(size_t i) { return base() + i * 8; }
  Op op(OpKind kind, uint64_t address, uint64_t length) {
    Op o;
    o.kind = kind;
    o.address = address;
    o.length = length;
    o.token = k_token;
    return o;
  }
  Op add_if(size_t i, uint64_t mask, uint64_t value, uint64_t add, uint64_t undo) {
    Op o = op(OpKind::add_if, word(i), 8);
    o.compare = mask;
    o.value = value;
    o.operand = add;
    o.undo = undo;
    return o;
  }
  static constexpr uint64_t k_token = 0x1234;
  std::vector<uint64_t> m_memory;
  RegionTable m_regions;
};

TEST_F(MessageSequenceTest, RunsInOrderAndAnswersWordsThenTheGetsBytes) {
  const uint64_t put = 777;
  Op fadd = op(OpKind::atomic, word(3), 8);
  fadd.atomic_op = static_cast<uint8_t>(AtomicOp::fetch_add);
  fadd.operand = 5;
  std::vector<Op> ops = {op(OpKind::get, word(2), 8), op(OpKind::put, word(2), 8), fadd, op(OpKind::get, word(2), 16)};
  ASSERT_EQ(check(ops, sizeof put, m_regions).refusal, Refusal::none);
  std::vector<std::byte> answer(answer_bytes(ops));
  ASSERT_EQ(answer.size(), 4 * 8 + 8 + 16u);
  const Outcome out = run(ops, reinterpret_cast<const std::byte*>(&put), answer.data());
  EXPECT_EQ(out.ran, 4u);
  EXPECT_FALSE(out.aborted);
  uint64_t words[4 + 1 + 2];
  std::memcpy(words, answer.data(), sizeof words);
  EXPECT_EQ(words[2], 3u) << "the fetch-add's old value";
  EXPECT_EQ(words[4], 2u) << "the first get read before the put";
  EXPECT_EQ(words[5], 777u) << "the last get read after it";
  EXPECT_EQ(words[6], 8u) << "and after the fetch-add";
  EXPECT_EQ(m_memory[3], 8u);
}

TEST_F(MessageSequenceTest, AFailingConditionStopsTheMessageAndUndoesTheConditionalAddsBeforeIt) {
  m_memory[1] = 10;
  m_memory[2] = 21;  // odd: the condition (low bit clear) fails
  const uint64_t put = 99;
  std::vector<Op> ops = {add_if(0, 1, 0, 1, 1), add_if(1, 1, 0, 1, 1), add_if(2, 1, 0, 1, 1),
                         op(OpKind::put, word(5), 8), add_if(3, 1, 0, 1, 1)};
  ASSERT_EQ(check(ops, 8, m_regions).refusal, Refusal::none);
  std::vector<std::byte> answer(answer_bytes(ops));
  const Outcome out = run(ops, reinterpret_cast<const std::byte*>(&put), answer.data());
  EXPECT_TRUE(out.aborted);
  EXPECT_EQ(out.ran, 2u) << "the third stopped it";
  uint64_t words[5];
  std::memcpy(words, answer.data(), sizeof words);
  EXPECT_EQ(words[0], 0u);
  EXPECT_EQ(words[1], 10u);
  EXPECT_EQ(words[2], 21u) << "the word that stopped it, as seen";
  EXPECT_EQ(m_memory[0], 2u) << "taken (+1) and undone (+1)";
  EXPECT_EQ(m_memory[1], 12u);
  EXPECT_EQ(m_memory[2], 21u) << "untouched";
  EXPECT_EQ(m_memory[5], 5u) << "the put after it never ran";
  EXPECT_EQ(m_memory[3], 3u) << "nor the add after it";
}

TEST_F(MessageSequenceTest, AFailingConditionStopsOnlyItsGroupAndWhatFollowsTheGroupRuns) {
  // Group 1: take word 1 (add 1 while odd), put 99 into word 5, take word 2
  // (fails: it is 2, asked to be 3), get word 5, add to word 1 again.
  // Group 2: take word 7, get it, put 42 into word 8, add to word 7 again.
  const uint64_t puts[2] = {99, 42};
  std::vector<Op> ops = {add_if(1, 1, 1, 1, 1),         op(OpKind::put, word(5), 8), add_if(2, ~uint64_t{0}, 3, 1, 1),
                         op(OpKind::get, word(5), 8),   add_if(1, 0, 0, 1, 1),      Op{.kind = OpKind::group_end},
                         add_if(7, 0, 0, 1, 1),         op(OpKind::get, word(7), 8), op(OpKind::put, word(8), 8),
                         add_if(7, 0, 0, 1, 1),         Op{.kind = OpKind::group_end}};
  ASSERT_EQ(check(ops, sizeof puts, m_regions).refusal, Refusal::none);
  std::vector<std::byte> answer(answer_bytes(ops));
  std::memset(answer.data(), 0xff, answer.size());
  const Outcome out = run(ops, reinterpret_cast<const std::byte*>(puts), answer.data());
  EXPECT_EQ(out.ran, ops.size()) << "every group was gone through";
  EXPECT_FALSE(out.aborted) << "a stopped group does not stop the message";
  std::vector<uint64_t> words(ops.size() + 2);
  std::memcpy(words.data(), answer.data(), words.size() * 8);
  EXPECT_EQ(words[2], 2u) << "the word that stopped the group, as seen";
  EXPECT_EQ(words[5], 3u) << "group 1 stopped at its 3rd operation (1 + index 2)";
  EXPECT_EQ(words[10], 0u) << "group 2 ran whole";
  EXPECT_EQ(words[11], 0u) << "group 1's skipped get answers zeros, not memory";
  EXPECT_EQ(words[12], 8u) << "group 2's get read word 7 after it was taken";
  EXPECT_EQ(m_memory[1], 3u) << "group 1's take of word 1 was undone by its undo (forward), its last add skipped";
  EXPECT_EQ(m_memory[5], 99u) << "group 1's put ran before the failing condition";
  EXPECT_EQ(m_memory[7], 9u) << "group 2 took and released word 7";
  EXPECT_EQ(m_memory[8], 42u) << "group 2's put took the second payload, past group 1's";
}

TEST_F(MessageSequenceTest, ABarrierAfterAStoppedGroupStopsTheMessageAndOnlyThen) {
  // Group 1 runs; barrier (passes); group 2 stops; group 3 runs; barrier
  // (stops the message); group 4 never runs.
  std::vector<Op> ops = {add_if(1, 0, 0, 1, 1),             Op{.kind = OpKind::group_end}, Op{.kind = OpKind::barrier},
                         add_if(2, ~uint64_t{0}, 99, 1, 1), Op{.kind = OpKind::group_end}, add_if(3, 0, 0, 1, 1),
                         Op{.kind = OpKind::group_end},     Op{.kind = OpKind::barrier},   add_if(4, 0, 0, 1, 1),
                         Op{.kind = OpKind::group_end}};
  ASSERT_EQ(check(ops, 0, m_regions).refusal, Refusal::none);
  std::vector<std::byte> answer(answer_bytes(ops));
  const Outcome out = run(ops, nullptr, answer.data());
  EXPECT_EQ(out.ran, 8u) << "up to and with the second barrier";
  EXPECT_FALSE(out.aborted);
  std::vector<uint64_t> words(ops.size());
  std::memcpy(words.data(), answer.data(), words.size() * 8);
  EXPECT_EQ(words[2], 0u) << "the first barrier let the message go on";
  EXPECT_EQ(words[4], 1u) << "group 2 was stopped by its first operation";
  EXPECT_EQ(words[7], 1u) << "the second barrier stopped the message";
  EXPECT_EQ(m_memory[1], 2u);
  EXPECT_EQ(m_memory[2], 2u) << "group 2 took nothing";
  EXPECT_EQ(m_memory[3], 4u) << "group 3, after the stopped group but before the barrier, ran";
  EXPECT_EQ(m_memory[4], 4u) << "group 4, after the barrier, did not";
}

TEST_F(MessageSequenceTest, AGroupEndOrBarrierThatTouchesMemoryIsRefused) {
  for (OpKind kind : {OpKind::group_end, OpKind::barrier}) {
    std::vector<Op> ops = {op(OpKind::get, word(0), 8), Op{.kind = kind, .address = word(1)}};
    EXPECT_EQ(check(ops, 0, m_regions).refusal, Refusal::malformed);
    EXPECT_EQ(check(ops, 0, m_regions).op, 1u) << "the refusal names the operation";
    ops[1] = Op{.kind = kind, .length = 8};
    EXPECT_EQ(check(ops, 0, m_regions).refusal, Refusal::malformed);
    ops[1] = Op{.kind = kind};
    EXPECT_EQ(check(ops, 0, m_regions).refusal, Refusal::none);
  }
}

TEST_F(MessageSequenceTest, ACompareSwapThatMustSucceedIsRestoredExactlyWhenALaterOneFails) {
  // What Transport::compare_swap_or_abort sends: add the difference, undo by
  // subtracting it.
  std::vector<Op> ops = {add_if(0, ~uint64_t{0}, 0, 40, uint64_t(0) - 40),
                         add_if(1, ~uint64_t{0}, 7, 1, uint64_t(0) - 1)};
  std::vector<std::byte> answer(answer_bytes(ops));
  const Outcome out = run(ops, nullptr, answer.data());
  EXPECT_TRUE(out.aborted);
  EXPECT_EQ(out.ran, 1u);
  EXPECT_EQ(m_memory[0], 0u) << "swapped to 40, then back";
  EXPECT_EQ(m_memory[1], 1u);
}

TEST_F(MessageSequenceTest, AMessageIsRefusedWholeBeforeAnythingRuns) {
  const std::vector<uint64_t> before = m_memory;
  auto refused = [&](std::vector<Op> ops, size_t payload, Refusal expected, size_t which) {
    const Verdict v = check(ops, payload, m_regions);
    EXPECT_EQ(v.refusal, expected);
    EXPECT_EQ(v.op, which);
  };
  // The first operations are fine; the refusal names the bad one.
  Op stranger = op(OpKind::put, word(1), 8);
  stranger.token = 99;
  refused({op(OpKind::put, word(0), 8), stranger}, 16, Refusal::unregistered, 1);
  refused({op(OpKind::get, word(60), 64)}, 0, Refusal::unregistered, 0);
  refused({op(OpKind::get, base() - 8, 8)}, 0, Refusal::unregistered, 0);
  refused({op(OpKind::get, ~uint64_t{0} - 4, 8)}, 0, Refusal::unregistered, 0);
  Op unaligned = op(OpKind::atomic, word(1) + 4, 8);
  refused({op(OpKind::get, word(0), 8), unaligned}, 0, Refusal::unaligned, 1);
  refused({op(OpKind::put, word(0), 8)}, 4, Refusal::malformed, 0);
  Op unknown = op(OpKind::get, word(0), 8);
  unknown.kind = static_cast<OpKind>(42);
  refused({unknown}, 0, Refusal::malformed, 0);
  refused({}, 0, Refusal::malformed, 0);
  refused(std::vector<Op>(k_max_ops + 1, op(OpKind::get, word(0), 8)), 0, Refusal::too_large, 0);
  EXPECT_EQ(m_memory, before) << "checking runs nothing";
}

TEST_F(MessageSequenceTest, RegionsAreFoundByTheirOwnTokenOnly) {
  std::vector<uint64_t> other(8, 0);
  m_regions.add(reinterpret_cast<uint64_t>(other.data()), 64, MemoryKind::host, 0x5678);
  EXPECT_EQ(m_regions.check(reinterpret_cast<uint64_t>(other.data()), 8, 0x5678), Refusal::none);
  EXPECT_EQ(m_regions.check(reinterpret_cast<uint64_t>(other.data()), 8, k_token), Refusal::unregistered)
      << "a key to one region opens no other";
  m_regions.add(0x1000, 64, MemoryKind::cuda, 0x9);
  EXPECT_EQ(m_regions.check(0x1000, 8, 0x9), Refusal::not_host);
  m_regions.remove(reinterpret_cast<uint64_t>(other.data()));
  EXPECT_EQ(m_regions.check(reinterpret_cast<uint64_t>(other.data()), 8, 0x5678), Refusal::unregistered);
}

}  // namespace
}  // namespace tiermem::sequence
