// Run-once records of the message path's targets; see answer_records.hpp.
#include "transport/answer_records.hpp"

namespace tiermem::transport_detail {

const AnswerRecords::Record* AnswerRecords::find(uint64_t origin, uint64_t id) {
  auto it = m_records.find({origin, id});
  return it == m_records.end() ? nullptr : &it->second;
}

void AnswerRecords::remember(uint64_t origin, uint64_t id, Record record) {
  m_words += record.words.size();
  m_records.emplace(std::pair{origin, id}, std::move(record));
  m_order.push_back({origin, id});
  while (m_words > k_records_words && m_order.size() > 1) {
    auto it = m_records.find(m_order.front());
    if (it != m_records.end()) {
      m_words -= it->second.words.size();
      m_records.erase(it);
    }
    m_order.pop_front();
  }
}

}  // namespace tiermem::transport_detail
