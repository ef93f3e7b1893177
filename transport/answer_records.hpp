// What a target remembers of the messages it ran, so that one with effects
// (puts, atomics, conditional adds, persists) runs once however often it is
// asked: an asker sends a request again when its answer is late or lost, and
// the repeat is answered from the record instead of run twice. Records are
// kept by (origin, id) (MessageRequest), the oldest forgotten beyond
// k_records_words answer words in all. Fabric-neutral: every fabric's target
// side of the message path keeps one.
#pragma once

#include <cstddef>
#include <cstdint>
#include <deque>
#include <mutex>
#include <unordered_map>
#include <utility>
#include <vector>

namespace tiermem::transport_detail {

class AnswerRecords {
 public:
  // The outcome of one message: what MessageReply says of it, and its
  // answer's words (one per operation).
  struct Record {
    uint32_t ran = 0;
    bool aborted = false;
    bool has_gets = false;  // it also read: a repeat cannot be answered (its bytes are gone)
    std::vector<uint64_t> words;
  };

  // Held by the caller around find() and remember(), and for as long as it
  // uses what find() returned (which a remember() may forget).
  std::mutex& mutex() { return m_lock; }

  // The record of (origin, id), or null. Caller holds mutex().
  const Record* find(uint64_t origin, uint64_t id);
  // Keeps `record` for (origin, id), forgetting the oldest beyond
  // k_records_words (never the newest). Caller holds mutex().
  void remember(uint64_t origin, uint64_t id, Record record);

  static constexpr size_t k_records_words = 1 << 17;

 private:
  struct PairHash {
    size_t operator()(const std::pair<uint64_t, uint64_t>& p) const { return p.first ^ (p.second * 0x9e3779b97f4a7c15ull); }
  };
  std::mutex m_lock;
  std::unordered_map<std::pair<uint64_t, uint64_t>, Record, PairHash> m_records;
  std::deque<std::pair<uint64_t, uint64_t>> m_order;
  size_t m_words = 0;
};

}  // namespace tiermem::transport_detail
