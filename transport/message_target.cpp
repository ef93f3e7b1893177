#include "transport/message_target.hpp"

#include <cstring>
#include <string>

namespace tiermem::transport_detail {

using sequence::Op;
using sequence::OpKind;
using sequence::Refusal;

TargetAnswer run_request(const MessageRequest& h, std::span<const Op> ops, const std::byte* puts, size_t length,
                         const sequence::RegionTable& regions, AnswerRecords& records, StagingPool& pool) {
  TargetAnswer out;
  out.reply.origin = h.origin;
  out.reply.id = h.id;
  const sequence::Verdict verdict = sequence::check(ops, length, regions);
  if (verdict.refusal != Refusal::none) {
    out.reply.refusal = verdict.refusal;
    out.reply.refused_op = static_cast<uint32_t>(verdict.op);
    return out;
  }
  bool effects = false;
  bool gets = false;
  for (const Op& op : ops) {
    effects = effects || op.kind != OpKind::get;
    gets = gets || op.kind == OpKind::get;
  }
  const size_t words = ops.size() * sizeof(uint64_t);
  if (effects) {
    std::lock_guard lock(records.mutex());
    if (const AnswerRecords::Record* done = records.find(h.origin, h.id)) {
      // Asked again (its answer was lost): answered from the record, not run
      // twice. Its gets cannot be read again as they were; an asker that
      // mixes gets with effects asks again from the start.
      if (done->has_gets) {
        out.reply.refusal = Refusal::repeated;
        return out;
      }
      out.reply.ran = done->ran;
      out.reply.flags = done->aborted ? k_reply_aborted : 0;
      out.answer = pool.take(words);
      std::memcpy(out.answer.data(), done->words.data(), words);
      out.length = words;
      return out;
    }
  }
  out.answer = pool.take(sequence::answer_bytes(ops));
  const sequence::Outcome run = sequence::run(ops, puts, out.answer.data());
  out.reply.ran = static_cast<uint32_t>(run.ran);
  out.reply.flags = run.aborted ? k_reply_aborted : 0;
  if (effects) {
    AnswerRecords::Record record{out.reply.ran, run.aborted, gets, std::vector<uint64_t>(ops.size())};
    std::memcpy(record.words.data(), out.answer.data(), words);
    std::lock_guard lock(records.mutex());
    records.remember(h.origin, h.id, std::move(record));
  }
  out.length = words + sequence::get_bytes(ops, run.ran);
  return out;
}

Status answer_status(Refusal refusal, uint32_t refused_op, std::span<const Op> ops, bool aborted, uint32_t ran) {
  if (refusal != Refusal::none) {
    if (refused_op < ops.size()) {
      return sequence::refusal_error(refusal, ops[refused_op]);
    }
    if (refusal == Refusal::unadmitted) {
      return Status(ErrorCode::permission_denied,
                    "the peer's listener refused this connection: it did not present the admission token of the "
                    "address the peer hands out");
    }
    return Status(ErrorCode::invalid_argument, "peer refused a malformed message");
  }
  if (aborted) {
    return Status(ErrorCode::failed_precondition, "a conditional add found its word otherwise (operation " +
                                                      std::to_string(ran) + " of " + std::to_string(ops.size()) +
                                                      " of the message); the rest was not run");
  }
  return Status();
}

}  // namespace tiermem::transport_detail
