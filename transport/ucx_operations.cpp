// The asking side of the UCX transport: get, put and atomics issued as
// native UCX operations or as request/reply messages; fences, waits and what
// a timeout leaves behind. See ucx_internal.hpp.
#include <poll.h>

#include <algorithm>

#include <cstdio>
#include <cstring>
#include <set>

#include "transport/ucx_internal.hpp"

namespace tiermem::ucx_detail {

std::unique_ptr<MessageOp> message(MessageKind kind, uint64_t address, uint64_t length) {
  auto op = std::make_unique<MessageOp>();
  op->header.kind = kind;
  op->header.address = address;
  op->header.length = length;
  return op;
}

Status refusal_error(Refusal r, const MessageRequest& h) {
  std::string what;
  switch (r) {
    case Refusal::unregistered: what = "the range is not in the registered region of the key used"; break;
    case Refusal::unaligned: what = "the atomic word is not 8-byte aligned"; break;
    case Refusal::not_host: what = "the region is device memory, which messages cannot reach"; break;
    default: what = "malformed request"; break;
  }
  char where[64];
  std::snprintf(where, sizeof where, "0x%llx+%llu", static_cast<unsigned long long>(h.address),
                static_cast<unsigned long long>(h.length));
  return Status(ErrorCode::out_of_range, std::string("peer refused remote access to ") + where + ": " + what);
}

Status UcxTransport::get(Batch& batch, Endpoint& ep, void* dst, size_t length, uint64_t remote_addr, RemoteKey& key) {
  auto& e = static_cast<UcxEndpoint&>(ep);
  if (e.failed()) return peer_failed();
  auto& k = static_cast<UcxRemoteKey&>(key);
  if (k.m_messages) {
    auto op = message(MessageKind::get, remote_addr, length);
    op->header.token = k.m_token;
    op->dst = dst;
    return issue(batch, e, std::move(op));
  }
  ucp_request_param_t p{};
  return track(batch, e,
               ucp_get_nbx(e.m_ep, dst, length, remote_addr, static_cast<UcxRemoteKey&>(key).m_key, &p),
               "get");
}

Status UcxTransport::put(Batch& batch, Endpoint& ep, const void* src, size_t length, uint64_t remote_addr,
                         RemoteKey& key) {
  auto& e = static_cast<UcxEndpoint&>(ep);
  if (e.failed()) return peer_failed();
  auto& k = static_cast<UcxRemoteKey&>(key);
  if (k.m_messages) {
    auto op = message(MessageKind::put, remote_addr, length);
    op->header.token = k.m_token;
    op->src = src;
    op->payload = length;
    return issue(batch, e, std::move(op));
  }
  ucp_request_param_t p{};
  return track(batch, e,
               ucp_put_nbx(e.m_ep, src, length, remote_addr, static_cast<UcxRemoteKey&>(key).m_key, &p),
               "put");
}

Status UcxTransport::atomic(Batch& batch, Endpoint& ep, AtomicOp op, uint64_t operand, uint64_t compare,
                            uint64_t remote_addr, RemoteKey& key, uint64_t* result) {
  auto& e = static_cast<UcxEndpoint&>(ep);
  if (e.failed()) return peer_failed();
  auto& k = static_cast<UcxRemoteKey&>(key);
  if (k.m_messages) {
    auto m = message(MessageKind::atomic, remote_addr, sizeof(uint64_t));
    m->header.token = k.m_token;
    m->header.op = static_cast<uint8_t>(op);
    m->header.operand = operand;
    m->header.compare = compare;
    m->result = result;
    return issue(batch, e, std::move(m));
  }
  auto& b = static_cast<UcxBatch&>(batch);
  ucp_request_param_t p{};
  p.op_attr_mask = UCP_OP_ATTR_FIELD_DATATYPE | UCP_OP_ATTR_FIELD_REPLY_BUFFER;
  p.datatype = ucp_dt_make_contig(8);
  p.reply_buffer = result;
  ucp_atomic_op_t opcode = UCP_ATOMIC_OP_ADD;
  if (op == AtomicOp::compare_swap) {
    // UCX: Result = Y; if (X == Y) Y = Z, with X in buffer and Z in reply.
    opcode = UCP_ATOMIC_OP_CSWAP;
    *result = operand;
    b.m_operands.push_back(compare);
  } else {
    opcode = op == AtomicOp::swap ? UCP_ATOMIC_OP_SWAP : UCP_ATOMIC_OP_ADD;
    b.m_operands.push_back(operand);
  }
  return track(batch, e,
               ucp_atomic_op_nbx(e.m_ep, opcode, &b.m_operands.back(), 1, remote_addr,
                                 static_cast<UcxRemoteKey&>(key).m_key, &p),
               "atomic");
}

Status UcxTransport::fence(Batch& batch, std::chrono::milliseconds timeout) {
  auto& b = static_cast<UcxBatch&>(batch);
  // Message operations are ordered by waiting for their answers: the
  // target has run them then.
  if (b.m_done < b.m_messages.size()) {
    Status s = drive(b, timeout, true);
    if (!s.ok()) return s;
  }
  const ucs_status_t st = ucp_worker_fence(m_worker);
  return st == UCS_OK ? Status() : ucx_error("fence", st);
}

Status UcxTransport::wait(Batch& batch, std::chrono::milliseconds timeout) {
  auto& b = static_cast<UcxBatch&>(batch);
  Status s = drive(b, timeout, false);
  if (!s.ok()) return s;
  s = std::move(b.m_error);
  b.m_error = Status();
  b.clear();
  return s;
}

Status UcxTransport::flush(Endpoint& ep, std::chrono::milliseconds timeout) {
  auto& e = static_cast<UcxEndpoint&>(ep);
  if (e.failed()) return peer_failed();
  // A message operation completes only when the target has answered.
  if (e.m_messages) return Status();
  ucp_request_param_t p{};
  UcxBatch b;
  Status s = track(b, e, ucp_ep_flush_nbx(e.m_ep, &p), "flush");
  if (!s.ok()) return s;
  return wait(b, timeout);
}

Status UcxTransport::track(Batch& batch, UcxEndpoint& ep, ucs_status_ptr_t request, const char* what) {
  if (request == nullptr) return Status();
  if (UCS_PTR_IS_ERR(request)) return ucx_error(std::string("issuing ") + what, UCS_PTR_STATUS(request));
  static_cast<UcxBatch&>(batch).m_requests.push_back({request, &ep});
  return Status();
}

Status UcxTransport::check_waiting(UcxBatch& b) {
  std::vector<UcxEndpoint*> eps;
  for (const auto& r : b.m_requests) eps.push_back(r.ep);
  for (size_t i = 0; i < b.m_messages.size(); ++i) {
    if (!b.m_is_done[i]) eps.push_back(b.m_messages[i]->ep);
  }
  std::sort(eps.begin(), eps.end());
  eps.erase(std::unique(eps.begin(), eps.end()), eps.end());
  for (UcxEndpoint* ep : eps) {
    if (ep == nullptr) continue;
    if (Status s = m_wait_check(*ep); !s.ok()) {
      ep->m_failed.store(true, std::memory_order_release);
      return s;
    }
  }
  return Status();
}

Status UcxTransport::drive(UcxBatch& b, std::chrono::milliseconds timeout, bool messages_only) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  auto next_check = std::chrono::steady_clock::now() + m_check_interval;
  unsigned idle = 0;
  for (;;) {
    const bool requests_left = !messages_only && reap_requests(b, b.m_error);
    const bool messages_left = reap_messages(b, b.m_error);
    if (!requests_left && !messages_left) return Status();
    if (ucp_worker_progress(m_worker) != 0) {
      idle = 0;
      continue;
    }
    if (++idle < k_spins_before_sleep) continue;
    idle = 0;
    if (m_wait_check && std::chrono::steady_clock::now() > next_check) {
      if (Status s = check_waiting(b); !s.ok()) {
        abandon(b);
        b.m_error = Status();
        return s;
      }
      next_check = std::chrono::steady_clock::now() + m_check_interval;
    }
    if (std::chrono::steady_clock::now() > deadline) {
      const std::string what = unfinished(b);
      abandon(b);
      b.m_error = Status();
      return Status(ErrorCode::timeout, "remote operations did not complete within " +
                                            std::to_string(timeout.count()) + " ms (" + what + ")");
    }
    // Nothing moved for a while: sleep until the fabric has news instead of
    // burning a core the peer (or its daemon) may need.
    if (ucp_worker_arm(m_worker) == UCS_OK) {
      pollfd p{m_efd, POLLIN, 0};
      (void)::poll(&p, 1, 1);
    }
  }
}

std::string UcxTransport::unfinished(UcxBatch& b) {
  size_t sending = 0, unanswered = 0, landing = 0;
  for (size_t i = 0; i < b.m_messages.size(); ++i) {
    if (b.m_is_done[i]) continue;
    const MessageOp& op = *b.m_messages[i];
    std::lock_guard lock(m_ops_lock);
    if (op.recv_request != nullptr) ++landing;
    else if (op.send_request != nullptr) ++sending;
    else ++unanswered;
  }
  return std::to_string(b.m_requests.size()) + " one-sided, " + std::to_string(sending) + " request(s) being sent, " +
         std::to_string(unanswered) + " unanswered, " + std::to_string(landing) + " answer(s) landing";
}

bool UcxTransport::reap_requests(UcxBatch& b, Status& result) {
  for (size_t i = 0; i < b.m_requests.size();) {
    const ucs_status_t st = ucp_request_check_status(b.m_requests[i].request);
    if (st == UCS_INPROGRESS) {
      ++i;
      continue;
    }
    if (st != UCS_OK && result.ok()) result = ucx_error("remote operation", st);
    ucp_request_free(b.m_requests[i].request);
    b.m_requests[i] = b.m_requests.back();
    b.m_requests.pop_back();
  }
  return !b.m_requests.empty();
}

bool UcxTransport::reap_messages(UcxBatch& b, Status& result) {
  for (size_t i = 0; i < b.m_messages.size(); ++i) {
    if (b.m_is_done[i]) continue;
    MessageOp& op = *b.m_messages[i];
    if (op.send_request != nullptr) {
      const ucs_status_t st = ucp_request_check_status(op.send_request);
      if (st == UCS_INPROGRESS) continue;
      ucp_request_free(op.send_request);
      op.send_request = nullptr;
      if (st != UCS_OK) {
        std::lock_guard lock(m_ops_lock);
        if (op.status == UCS_OK) op.status = st;
        op.replied = op.recv_request == nullptr;  // no answer will come
      }
    }
    bool resend = false;
    {
      std::lock_guard lock(m_ops_lock);
      if (!op.replied && op.recv_request == nullptr && op.ep->failed()) {
        op.replied = true;
        if (op.status == UCS_OK) op.status = UCS_ERR_CONNECTION_RESET;
      }
      // Unanswered for long: the request or its answer was lost (UCX 1.13
      // over shared memory now and then drops an answer sent on the reply
      // endpoint). Ask again; the target runs an atomic only once.
      resend = !op.replied && op.recv_request == nullptr &&
               std::chrono::steady_clock::now() - op.sent_at > k_resend_after * (1 << std::min(op.resends, 3));
      if (!resend && (!op.replied || op.recv_request != nullptr)) continue;
      if (!resend) m_ops.erase(op.header.id);
    }
    if (resend) {
      ++op.resends;
      post_request(op);
      continue;
    }
    b.m_is_done[i] = true;
    ++b.m_done;
    if (result.ok()) {
      if (op.refusal != Refusal::none) result = refusal_error(op.refusal, op.header);
      else if (op.status != UCS_OK) result = ucx_error("remote operation", op.status);
    }
  }
  return b.m_done < b.m_messages.size();
}

Status UcxTransport::issue(Batch& batch, UcxEndpoint& ep, std::unique_ptr<MessageOp> op) {
  auto& b = static_cast<UcxBatch&>(batch);
  op->ep = &ep;
  b.m_messages.push_back(std::move(op));
  b.m_is_done.push_back(false);
  send_message(*b.m_messages.back());
  return Status();
}

void UcxTransport::send_message(MessageOp& op) {
  {
    std::lock_guard lock(m_ops_lock);
    op.header.id = ++m_next_op;
    m_ops.emplace(op.header.id, &op);
  }
  op.header.origin = m_origin;
  op.sent = true;
  post_request(op);
}

void UcxTransport::post_request(MessageOp& op) {
  op.sent_at = std::chrono::steady_clock::now();
  ucp_request_param_t p{};
  p.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
  // Eager only: with rendezvous the target would pull the payload from our
  // buffer later (over shared memory with process_vm_readv, which UCX
  // treats as fatal when the buffer is gone after a timeout).
  p.flags = UCP_AM_SEND_FLAG_EAGER;
  if (op.ep->m_messages) {
    // Over TCP the answer comes back on the connection the request came by.
    op.header.flags |= k_answer_on_reply_ep;
    p.flags |= UCP_AM_SEND_FLAG_REPLY;
  }
  void* request = op.ep->m_ep == nullptr
                      ? UCS_STATUS_PTR(UCS_ERR_CONNECTION_RESET)
                      : ucp_am_send_nbx(op.ep->m_ep, k_request_id, &op.header, sizeof op.header, op.src, op.payload, &p);
  if (UCS_PTR_IS_ERR(request)) {
    std::lock_guard lock(m_ops_lock);
    op.status = UCS_PTR_STATUS(request);
    op.replied = true;
  } else {
    op.send_request = request;
  }
}

void UcxTransport::abandon(UcxBatch& b) {
  std::set<UcxEndpoint*> eps;
  for (const auto& r : b.m_requests) eps.insert(r.ep);
  for (size_t i = 0; i < b.m_messages.size(); ++i) {
    if (!b.m_is_done[i]) eps.insert(b.m_messages[i]->ep);
  }
  for (UcxEndpoint* ep : eps) {
    ep->m_failed.store(true);
    if (ep->m_ep != nullptr) close_endpoint(ep->m_ep, true);
    ep->m_ep = nullptr;
  }
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(2);
  for (const auto& r : b.m_requests) {
    while (ucp_request_check_status(r.request) == UCS_INPROGRESS && std::chrono::steady_clock::now() < deadline) {
      ucp_worker_progress(m_worker);
    }
    ucp_request_free(r.request);
  }
  b.m_requests.clear();
  for (size_t i = 0; i < b.m_messages.size(); ++i) {
    MessageOp& op = *b.m_messages[i];
    if (b.m_is_done[i]) continue;
    if (op.send_request != nullptr) {
      while (ucp_request_check_status(op.send_request) == UCS_INPROGRESS &&
             std::chrono::steady_clock::now() < deadline) {
        ucp_worker_progress(m_worker);
      }
      ucp_request_free(op.send_request);
      op.send_request = nullptr;
    }
    for (;;) {
      {
        std::lock_guard lock(m_ops_lock);
        if (op.recv_request == nullptr || std::chrono::steady_clock::now() >= deadline) {
          // Late answers find no operation and are dropped.
          m_ops.erase(op.header.id);
          break;
        }
      }
      ucp_worker_progress(m_worker);
    }
  }
  b.clear();
}

ucs_status_t UcxTransport::on_reply(void* arg, const void* header, size_t header_length, void* data, size_t length,
                                    const ucp_am_recv_param_t* param) {
  auto& self = *static_cast<UcxTransport*>(arg);
  if (header_length != sizeof(MessageReply)) return UCS_OK;
  MessageReply r;
  std::memcpy(&r, header, sizeof r);
  if (r.magic != k_message_magic) return UCS_OK;
  if (r.origin != self.m_origin) return UCS_OK;  // not an answer to us
  std::lock_guard lock(self.m_ops_lock);
  auto it = self.m_ops.find(r.id);
  if (it == self.m_ops.end()) return UCS_OK;  // abandoned
  MessageOp& op = *it->second;
  if (op.replied) return UCS_OK;
  if (r.refusal != Refusal::none) {
    op.refusal = r.refusal;
    op.replied = true;
    return UCS_OK;
  }
  if (op.header.kind != MessageKind::get) {
    if (op.result != nullptr) *op.result = r.value;
    op.replied = true;
    return UCS_OK;
  }
  if (length != op.header.length) {
    op.status = UCS_ERR_MESSAGE_TRUNCATED;
    op.replied = true;
    return UCS_OK;
  }
  if ((param->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV) == 0) {
    std::memcpy(op.dst, data, length);
    op.replied = true;
    return UCS_OK;
  }
  ucp_request_param_t p{};
  p.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA;
  p.cb.recv_am = &UcxTransport::on_reply_landed;
  p.user_data = &op;
  void* request = ucp_am_recv_data_nbx(self.m_worker, data, op.dst, length, &p);
  if (request == nullptr) {
    op.replied = true;
  } else if (UCS_PTR_IS_ERR(request)) {
    op.status = UCS_PTR_STATUS(request);
    op.replied = true;
  } else if (!op.replied) {
    op.recv_request = request;
  }
  return UCS_OK;
}

void UcxTransport::on_reply_landed(void* request, ucs_status_t status, size_t, void* user_data) {
  auto& op = *static_cast<MessageOp*>(user_data);
  {
    std::lock_guard lock(op.ep->m_owner.m_ops_lock);
    if (status != UCS_OK && op.status == UCS_OK) op.status = status;
    op.replied = true;
    op.recv_request = nullptr;
  }
  ucp_request_free(request);
}

}  // namespace tiermem::ucx_detail
