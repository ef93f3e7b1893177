// What every fabric's message path shares around message_sequence: the
// target running a checked request once (run_request), and the asker turning
// an answer into the operations' outcome (answer_status). A fabric only moves
// the bytes: UCX's active messages, libfabric's tagged messages.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>

#include <tiermem/status.h>

#include "transport/answer_records.hpp"
#include "transport/message_sequence.hpp"
#include "transport/message_wire.hpp"
#include "transport/staging_pool.hpp"

namespace tiermem::transport_detail {

// An answer to send: the reply header, then `length` bytes of `answer` (one
// word per operation, then the gets' bytes; empty for a refusal).
struct TargetAnswer {
  MessageReply reply;
  StagingBuffer answer;
  size_t length = 0;
};

// Checks request `h`'s operations whole against `regions` (the puts' bytes,
// `length` of them, at `puts`), runs them in order, and returns the answer.
// A request with effects (anything but gets) is run once per (origin, id):
// asked again, it is answered from `records` (refused `repeated` when it also
// read, since what it read then is gone).
TargetAnswer run_request(const MessageRequest& h, std::span<const sequence::Op> ops, const std::byte* puts,
                         size_t length, const sequence::RegionTable& regions, AnswerRecords& records,
                         StagingPool& pool);

// The outcome of an answered message of `ops` for its asker: a refusal
// (naming the operation refused), an add_if that stopped the message
// (failed_precondition), else OK.
Status answer_status(sequence::Refusal refusal, uint32_t refused_op, std::span<const sequence::Op> ops, bool aborted,
                     uint32_t ran);

// An operation of a message (the asking side fills in the rest).
inline sequence::Op make_op(sequence::OpKind kind, uint64_t address, uint64_t length, uint64_t token) {
  sequence::Op op;
  op.kind = kind;
  op.address = address;
  op.length = length;
  op.token = token;
  return op;
}

}  // namespace tiermem::transport_detail
