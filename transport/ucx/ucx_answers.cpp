// The target side of the UCX transport's messages: a request is checked whole
// against the registered regions, run on our memory in order (a message with
// effects once, however often it is asked) and answered on the asker's answer
// endpoint. See ucx_internal.hpp and message_sequence.hpp.
#include <cstring>

#include "transport/ucx/ucx_internal.hpp"

namespace tiermem::ucx_detail {

using sequence::Op;
using sequence::OpKind;

ucs_status_t UcxTransport::on_request(void* arg, const void* header, size_t header_length, void* data, size_t length,
                                      const ucp_am_recv_param_t* param) {
  auto& self = *static_cast<UcxTransport*>(arg);
  if (header_length < sizeof(MessageRequest)) return UCS_OK;  // not ours
  MessageRequest h;
  std::memcpy(&h, header, sizeof h);
  if (h.magic != k_message_magic) return UCS_OK;
  const bool rndv = (param->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV) != 0;
  const bool on_reply_ep =
      (h.flags & k_answer_on_reply_ep) != 0 && (param->recv_attr & UCP_AM_RECV_ATTR_FIELD_REPLY_EP) != 0;
  MessageReply r;
  r.origin = h.origin;
  r.id = h.id;
  if (self.m_admission != 0) {
    // Through our listener only, with its token (ucx_listener.cpp). A
    // request without it runs nothing; its connection, never admitted, is
    // closed when its admission window ends.
    if (!on_reply_ep) return UCS_OK;
    if (h.admission != self.m_admission) {
      r.refusal = Refusal::unadmitted;
      self.send_reply(param->reply_ep, r, StagingBuffer(), 0, false);
      return UCS_OK;
    }
    if (h.kind == MessageKind::hello) self.admit(param->reply_ep);
  }
  if (h.kind == MessageKind::hello) {
    ucp_ep_h ep = on_reply_ep ? param->reply_ep : rndv ? nullptr : self.open_answer_ep(h.origin, data);
    if (ep != nullptr) self.send_reply(ep, r, StagingBuffer(), 0, !on_reply_ep);
    return UCS_OK;
  }
  ucp_ep_h ep = on_reply_ep ? param->reply_ep : self.answer_ep(h.origin);
  if (ep == nullptr) return UCS_OK;  // no hello from it: nowhere to answer
  const bool shared = !on_reply_ep;
  // Refused before anything is staged: nothing of the message runs, and a
  // rendezvous payload is never fetched.
  const bool in_header = (h.flags & k_ops_in_header) != 0;
  const size_t ops_bytes = h.ops * sizeof(Op);
  Refusal refusal = Refusal::none;
  if (h.kind != MessageKind::sequence || h.ops == 0) refusal = Refusal::malformed;
  if (h.ops > sequence::k_max_ops || length > sequence::k_max_ops * sizeof(Op) + sequence::k_max_bytes) {
    refusal = Refusal::too_large;
  } else if (in_header ? header_length != sizeof h + ops_bytes : header_length != sizeof h || length < ops_bytes) {
    refusal = Refusal::malformed;
  }
  if (refusal != Refusal::none) {
    r.refusal = refusal;
    self.send_reply(ep, r, StagingBuffer(), 0, shared);
    return UCS_OK;
  }
  std::vector<Op> ops(h.ops);
  // Neither the header nor the payload need be aligned for Op.
  if (in_header) std::memcpy(ops.data(), static_cast<const std::byte*>(header) + sizeof h, ops_bytes);
  if (!rndv) {
    const auto* bytes = static_cast<const std::byte*>(data);
    if (!in_header) std::memcpy(ops.data(), bytes, ops_bytes);
    const size_t skip = in_header ? 0 : ops_bytes;
    self.run_message(ep, h, std::move(ops), bytes + skip, length - skip, shared);
    return UCS_OK;
  }
  // A large message: stage all of it, then run it (an asker that dies
  // mid-send leaves nothing half-done), within the staging limit.
  if (self.m_staged.fetch_add(length) + length > k_staging_limit) {
    self.m_staged.fetch_sub(length);
    r.refusal = Refusal::busy;
    self.send_reply(ep, r, StagingBuffer(), 0, shared);
    return UCS_OK;
  }
  auto* landing = new Landing{&self, ep, h, std::move(ops), self.m_pool.take(length), shared};
  ucp_request_param_t p{};
  p.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA;
  p.cb.recv_am = &UcxTransport::on_request_landed;
  p.user_data = landing;
  void* request = ucp_am_recv_data_nbx(self.m_worker, data, landing->bytes.data(), length, &p);
  if (request == nullptr) {
    on_request_landed(nullptr, UCS_OK, length, landing);
  } else if (UCS_PTR_IS_ERR(request)) {
    self.m_staged.fetch_sub(length);
    delete landing;  // the peer's send fails; it sees that
  }
  return UCS_OK;
}

void UcxTransport::on_request_landed(void* request, ucs_status_t status, size_t, void* user_data) {
  std::unique_ptr<Landing> landing(static_cast<Landing*>(user_data));
  UcxTransport& self = *landing->self;
  const size_t length = landing->bytes.size();
  // A failed receive means the asker is gone: nothing runs, nobody to answer.
  if (status == UCS_OK) {
    const bool in_header = (landing->header.flags & k_ops_in_header) != 0;
    const std::byte* bytes = landing->bytes.data();
    const size_t skip = in_header ? 0 : landing->ops.size() * sizeof(Op);
    if (!in_header) std::memcpy(landing->ops.data(), bytes, skip);
    self.run_message(landing->ep, landing->header, std::move(landing->ops), bytes + skip, length - skip,
                     landing->shared);
  }
  landing.reset();
  self.m_staged.fetch_sub(length);
  if (request != nullptr) ucp_request_free(request);
}

void UcxTransport::run_message(ucp_ep_h ep, const MessageRequest& h, std::vector<Op> ops, const std::byte* puts,
                               size_t length, bool shared) {
  TargetAnswer a = run_request(h, ops, puts, length, m_regions, m_records, m_pool);
  send_reply(ep, a.reply, std::move(a.answer), a.length, shared);
}

void UcxTransport::send_reply(ucp_ep_h ep, const MessageReply& reply, StagingBuffer answer, size_t length,
                              bool shared) {
  struct Sending {
    MessageReply header;
    StagingBuffer answer;
  };
  auto* sending = new Sending{reply, std::move(answer)};
  ucp_request_param_t p{};
  p.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA | UCP_OP_ATTR_FIELD_FLAGS;
  // See post_request(): inline when small, and always over shared memory.
  p.flags = length <= k_eager_limit || shared ? UCP_AM_SEND_FLAG_EAGER : UCP_AM_SEND_FLAG_RNDV;
  p.cb.send = [](void* request, ucs_status_t, void* user_data) {
    delete static_cast<Sending*>(user_data);
    ucp_request_free(request);
  };
  p.user_data = sending;
  void* request =
      ucp_am_send_nbx(ep, k_reply_id, &sending->header, sizeof sending->header, sending->answer.data(), length, &p);
  if (request == nullptr || UCS_PTR_IS_ERR(request)) delete sending;
}

}  // namespace tiermem::ucx_detail
