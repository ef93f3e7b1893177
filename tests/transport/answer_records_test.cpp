// The target's run-once records (transport/answer_records): a message's
// record is found by (origin, id) until the records pass k_records_words
// words, when the oldest are forgotten first and the newest never.
#include "transport/answer_records.hpp"

#include <gtest/gtest.h>

#include <mutex>
#include <vector>

namespace tiermem::transport_detail {
namespace {

AnswerRecords::Record record(size_t words, uint64_t first) {
  AnswerRecords::Record r;
  r.ran = static_cast<uint32_t>(words);
  r.words.assign(words, first);
  return r;
}

TEST(AnswerRecordsTest, FindsWhatWasRememberedByOriginAndId) {
  AnswerRecords records;
  std::lock_guard lock(records.mutex());
  EXPECT_EQ(records.find(1, 7), nullptr);
  AnswerRecords::Record r = record(3, 42);
  r.aborted = true;
  r.has_gets = true;
  records.remember(1, 7, std::move(r));
  const AnswerRecords::Record* found = records.find(1, 7);
  ASSERT_NE(found, nullptr);
  EXPECT_EQ(found->ran, 3u);
  EXPECT_TRUE(found->aborted);
  EXPECT_TRUE(found->has_gets);
  EXPECT_EQ(found->words, std::vector<uint64_t>(3, 42));
  // The same id from another asker, or another id from the same, is another message.
  EXPECT_EQ(records.find(2, 7), nullptr);
  EXPECT_EQ(records.find(1, 8), nullptr);
}

TEST(AnswerRecordsTest, ForgetsTheOldestBeyondTheWordLimit) {
  AnswerRecords records;
  std::lock_guard lock(records.mutex());
  const size_t half = AnswerRecords::k_records_words / 2;
  records.remember(1, 1, record(half, 1));
  records.remember(1, 2, record(half, 2));
  ASSERT_NE(records.find(1, 1), nullptr);  // exactly at the limit: all kept
  records.remember(1, 3, record(1, 3));
  EXPECT_EQ(records.find(1, 1), nullptr);
  ASSERT_NE(records.find(1, 2), nullptr);
  ASSERT_NE(records.find(1, 3), nullptr);
  EXPECT_EQ(records.find(1, 3)->words, std::vector<uint64_t>(1, 3));
}

TEST(AnswerRecordsTest, KeepsTheNewestEvenBeyondTheLimit) {
  AnswerRecords records;
  std::lock_guard lock(records.mutex());
  records.remember(5, 1, record(1, 1));
  records.remember(5, 2, record(AnswerRecords::k_records_words + 1, 2));
  EXPECT_EQ(records.find(5, 1), nullptr);
  ASSERT_NE(records.find(5, 2), nullptr);
  EXPECT_EQ(records.find(5, 2)->words.size(), AnswerRecords::k_records_words + 1);
}

}  // namespace
}  // namespace tiermem::transport_detail
