// The target side of the UCX transport's messages: a request is checked
// against the registered regions, run on our memory (an atomic once, however
// often it is asked) and answered on the asker's answer endpoint. See
// ucx_internal.hpp.
#include <cstring>

#include "transport/ucx_internal.hpp"

namespace tiermem::ucx_detail {

uint64_t cpu_atomic(uint64_t* word, AtomicOp op, uint64_t operand, uint64_t compare) {
  switch (op) {
    case AtomicOp::fetch_add: return __atomic_fetch_add(word, operand, __ATOMIC_SEQ_CST);
    case AtomicOp::swap: return __atomic_exchange_n(word, operand, __ATOMIC_SEQ_CST);
    case AtomicOp::compare_swap: {
      uint64_t expected = compare;
      __atomic_compare_exchange_n(word, &expected, operand, false, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST);
      return expected;
    }
  }
  return 0;
}

ucs_status_t UcxTransport::on_request(void* arg, const void* header, size_t header_length, void* data, size_t length,
                                      const ucp_am_recv_param_t* param) {
  auto& self = *static_cast<UcxTransport*>(arg);
  if (header_length != sizeof(MessageRequest)) return UCS_OK;  // not ours
  MessageRequest h;
  std::memcpy(&h, header, sizeof h);
  if (h.magic != k_message_magic) return UCS_OK;
  MessageReply r;
  r.origin = h.origin;
  r.id = h.id;
  const bool rndv = (param->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV) != 0;
  const bool on_reply_ep =
      (h.flags & k_answer_on_reply_ep) != 0 && (param->recv_attr & UCP_AM_RECV_ATTR_FIELD_REPLY_EP) != 0;
  if (h.kind == MessageKind::hello) {
    ucp_ep_h ep = on_reply_ep ? param->reply_ep : rndv ? nullptr : self.open_answer_ep(h.origin, data);
    if (ep != nullptr) self.send_reply(ep, r, nullptr, 0);
    return UCS_OK;
  }
  ucp_ep_h ep = on_reply_ep ? param->reply_ep : self.answer_ep(h.origin);
  if (ep == nullptr) return UCS_OK;  // no hello from it: nowhere to answer
  Refusal refusal = self.m_regions.check(h.address, h.length, h.token);
  if (h.kind == MessageKind::atomic && (h.address % 8 != 0 || h.length != 8)) refusal = Refusal::unaligned;
  if (h.kind == MessageKind::put && length != h.length) refusal = Refusal::malformed;
  if (h.kind != MessageKind::get && h.kind != MessageKind::put && h.kind != MessageKind::atomic) {
    refusal = Refusal::malformed;
  }
  if (refusal != Refusal::none) {
    r.refusal = refusal;
    self.send_reply(ep, r, nullptr, 0);
    return UCS_OK;  // a rendezvous payload is dropped
  }
  auto* target = reinterpret_cast<void*>(h.address);
  switch (h.kind) {
    case MessageKind::get:
      self.send_reply(ep, r, target, h.length);
      break;
    case MessageKind::put:
      if (rndv) {
        auto* landing = new PutLanding{&self, ep, r};
        ucp_request_param_t p{};
        p.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA;
        p.cb.recv_am = &UcxTransport::on_put_landed;
        p.user_data = landing;
        void* request = ucp_am_recv_data_nbx(self.m_worker, data, target, length, &p);
        if (request == nullptr) {
          self.send_reply(ep, r, nullptr, 0);
          delete landing;
        } else if (UCS_PTR_IS_ERR(request)) {
          delete landing;  // the peer's send fails; it sees that
        }
      } else {
        std::memcpy(target, data, length);
        self.send_reply(ep, r, nullptr, 0);
      }
      break;
    case MessageKind::atomic: {
      // An atomic asked again (its answer was lost) is answered from the
      // record of its first run, not run twice.
      std::lock_guard lock(self.m_atomics_lock);
      const std::pair<uint64_t, uint64_t> key{h.origin, h.id};
      if (auto it = self.m_atomics_done.find(key); it != self.m_atomics_done.end()) {
        r.value = it->second;
      } else {
        r.value = cpu_atomic(static_cast<uint64_t*>(target), static_cast<AtomicOp>(h.op), h.operand, h.compare);
        self.m_atomics_done.emplace(key, r.value);
        self.m_atomics_order.push_back(key);
        if (self.m_atomics_order.size() > k_atomics_remembered) {
          self.m_atomics_done.erase(self.m_atomics_order.front());
          self.m_atomics_order.pop_front();
        }
      }
      self.send_reply(ep, r, nullptr, 0);
      break;
    }
    case MessageKind::hello:
      break;  // answered above
  }
  return UCS_OK;
}

void UcxTransport::on_put_landed(void* request, ucs_status_t status, size_t, void* user_data) {
  auto* landing = static_cast<PutLanding*>(user_data);
  // A failed receive means the peer is gone: nobody to answer.
  if (status == UCS_OK) landing->self->send_reply(landing->ep, landing->reply, nullptr, 0);
  delete landing;
  ucp_request_free(request);
}

void UcxTransport::send_reply(ucp_ep_h ep, const MessageReply& reply, const void* data, size_t length) {
  auto* header = new MessageReply(reply);
  ucp_request_param_t p{};
  p.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA | UCP_OP_ATTR_FIELD_FLAGS;
  p.flags = UCP_AM_SEND_FLAG_EAGER;  // see send_message()
  p.cb.send = [](void* request, ucs_status_t, void* user_data) {
    delete static_cast<MessageReply*>(user_data);
    ucp_request_free(request);
  };
  p.user_data = header;
  void* request = ucp_am_send_nbx(ep, k_reply_id, header, sizeof *header, data, length, &p);
  if (request == nullptr || UCS_PTR_IS_ERR(request)) delete header;
}

}  // namespace tiermem::ucx_detail
