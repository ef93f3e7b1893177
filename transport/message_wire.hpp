// The headers of the message path's requests and replies, shared by every
// fabric that carries operations as messages (message_sequence.hpp says what
// follows them: the operations, the puts' bytes; the answer's words, the
// gets' bytes). A request carries the operations of a batch to one endpoint:
// the target checks them all against its registered regions, runs them in
// order on its memory and answers once, with the request's id. Both sides run
// the same code, so headers are in host order. A fabric adds its own message
// ids (UCX: its active message ids, ucx/ucx_internal.hpp) and the flag bits
// marked as its own below.
#pragma once

#include <cstdint>

#include "transport/message_sequence.hpp"

namespace tiermem::transport_detail {

constexpr uint32_t k_message_magic = 0x544d5252;  // "RRMT"
// MessageRequest::flags: bit 0 (1) is the fabric's own (UCX: k_answer_on_reply_ep).
constexpr uint16_t k_ops_in_header = 2;  // MessageRequest::flags: the operations follow the header
constexpr uint16_t k_reply_aborted = 1;  // MessageReply::flags

// hello: the first request on a connection; it admits the connection (its
// header's admission token, where the target listens with one), and its
// payload may say where to answer (UCX over shared memory: the asking
// worker's address). sequence: the operations of a batch
// (message_sequence.hpp): right after our header when they fit in what the
// fabric sends as a header (k_ops_in_header; the payload is then the puts'
// bytes alone), else at the start of the payload.
// ping: asks nothing and is answered nothing; a fabric that learns of a dead
// peer only when a send to it fails sends one (libfabric over tcp).
enum class MessageKind : uint8_t { hello = 4, sequence = 5, ping = 6 };

struct MessageRequest {
  uint32_t magic = k_message_magic;
  MessageKind kind = MessageKind::sequence;
  uint8_t reserved = 0;
  uint16_t flags = 0;   // k_ops_in_header, and the fabric's own bit
  uint64_t id = 0;
  uint64_t ops = 0;     // operations at the start of the payload
  uint64_t origin = 0;  // the asking transport (random): with id, names a message for de-duplication
  uint64_t admission = 0;  // the token of the target's listener (0: reached by worker address)
};

struct MessageReply {
  uint32_t magic = k_message_magic;
  sequence::Refusal refusal = sequence::Refusal::none;
  uint64_t origin = 0;  // echoed: an answer meant for another transport is dropped
  uint64_t id = 0;
  uint32_t ran = 0;          // operations run
  uint32_t refused_op = 0;   // the operation a refusal names
  uint16_t flags = 0;        // k_reply_aborted: operation `ran` stopped the message
  uint16_t reserved[3] = {};
};

// The wire format: a change here breaks peers of another build.
static_assert(sizeof(MessageRequest) == 40);
static_assert(sizeof(MessageReply) == 40);

}  // namespace tiermem::transport_detail
