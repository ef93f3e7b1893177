// The asking side of the UCX transport: get, put and atomics issued as
// native UCX operations or collected into messages (one per endpoint and
// batch); waits that poll, then sleep until the answer wakes them; what a
// timeout leaves behind. See ucx_internal.hpp and wait_policy.hpp.
#include <poll.h>

#include <algorithm>
#include <cstring>
#include <set>

#include "transport/ucx/ucx_internal.hpp"

namespace tiermem::ucx_detail {

namespace {

using sequence::Op;
using sequence::OpKind;

void wake_waiter(void*, ucs_status_t, void* user_data) { static_cast<Waiter*>(user_data)->wake(); }

}  // namespace

ucp_request_param_t UcxTransport::one_sided_param() {
  ucp_request_param_t p{};
  p.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA;
  p.cb.send = &wake_waiter;
  p.user_data = &Waiter::of_this_thread();
  return p;
}

Status UcxTransport::get(TransportBatch& batch, Endpoint& ep, void* dst, size_t length, uint64_t remote_addr, RemoteKey& key) {
  auto& e = static_cast<UcxEndpoint&>(ep);
  auto& k = static_cast<UcxRemoteKey&>(key);
  // Collecting a message cannot fail once its operations were checked
  // (a group is never sent in part): a failed endpoint fails it at send.
  if (k.m_messages) return add_op(batch, e, make_op(OpKind::get, remote_addr, length, k.m_token), nullptr, dst, nullptr);
  if (e.failed()) return peer_failed();
  ucp_request_param_t p = one_sided_param();
  return track(batch, e, ucp_get_nbx(e.m_ep, dst, length, remote_addr, k.m_key, &p), "get");
}

Status UcxTransport::put(TransportBatch& batch, Endpoint& ep, const void* src, size_t length, uint64_t remote_addr,
                         RemoteKey& key) {
  auto& e = static_cast<UcxEndpoint&>(ep);
  auto& k = static_cast<UcxRemoteKey&>(key);
  if (k.m_messages) return add_op(batch, e, make_op(OpKind::put, remote_addr, length, k.m_token), src, nullptr, nullptr);
  if (e.failed()) return peer_failed();
  ucp_request_param_t p = one_sided_param();
  return track(batch, e, ucp_put_nbx(e.m_ep, src, length, remote_addr, k.m_key, &p), "put");
}

Status UcxTransport::atomic(TransportBatch& batch, Endpoint& ep, AtomicOp op, uint64_t operand, uint64_t compare,
                            uint64_t remote_addr, RemoteKey& key, uint64_t* result) {
  auto& e = static_cast<UcxEndpoint&>(ep);
  auto& k = static_cast<UcxRemoteKey&>(key);
  if (k.m_messages) {
    Op m = make_op(OpKind::atomic, remote_addr, sizeof(uint64_t), k.m_token);
    m.atomic_op = static_cast<uint8_t>(op);
    m.operand = operand;
    m.compare = compare;
    return add_op(batch, e, m, nullptr, nullptr, result);
  }
  if (e.failed()) return peer_failed();
  auto& b = static_cast<UcxBatch&>(batch);
  ucp_request_param_t p = one_sided_param();
  p.op_attr_mask |= UCP_OP_ATTR_FIELD_DATATYPE | UCP_OP_ATTR_FIELD_REPLY_BUFFER;
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
  return track(batch, e, ucp_atomic_op_nbx(e.m_ep, opcode, &b.m_operands.back(), 1, remote_addr, k.m_key, &p),
               "atomic");
}

Status UcxTransport::add_if(TransportBatch& batch, Endpoint& ep, WordCondition condition, uint64_t add, uint64_t undo,
                            uint64_t remote_addr, RemoteKey& key, uint64_t* old) {
  auto& e = static_cast<UcxEndpoint&>(ep);
  auto& k = static_cast<UcxRemoteKey&>(key);
  if (!k.m_messages) {
    return Status(ErrorCode::not_supported, "a conditional add needs the message path; this key is one-sided");
  }
  Op m = make_op(OpKind::add_if, remote_addr, sizeof(uint64_t), k.m_token);
  m.operand = add;
  m.compare = condition.mask;
  m.value = condition.value;
  m.undo = undo;
  return add_op(batch, e, m, nullptr, nullptr, old);
}

Status UcxTransport::persist(TransportBatch& batch, Endpoint& ep, uint64_t remote_addr, size_t length, RemoteKey& key) {
  auto& e = static_cast<UcxEndpoint&>(ep);
  auto& k = static_cast<UcxRemoteKey&>(key);
  if (!k.m_messages) return Status(ErrorCode::not_supported, "a persist needs the message path; this key is one-sided");
  return add_op(batch, e, make_op(OpKind::persist, remote_addr, length, k.m_token), nullptr, nullptr, nullptr);
}

Status UcxTransport::end_group(TransportBatch& batch, Endpoint& ep, uint64_t* stopped) {
  auto& e = static_cast<UcxEndpoint&>(ep);
  if (!e.m_messages && !e.m_shared) return Status(ErrorCode::not_supported, "groups need the message path");
  return add_op(batch, e, make_op(OpKind::group_end, 0, 0, 0), nullptr, nullptr, stopped);
}

Status UcxTransport::barrier(TransportBatch& batch, Endpoint& ep, uint64_t* stopped) {
  auto& e = static_cast<UcxEndpoint&>(ep);
  if (!e.m_messages && !e.m_shared) return Status(ErrorCode::not_supported, "barriers need the message path");
  return add_op(batch, e, make_op(OpKind::barrier, 0, 0, 0), nullptr, nullptr, stopped);
}

Status UcxTransport::reserve(TransportBatch& batch, Endpoint& ep, size_t ops, size_t put_bytes, size_t get_bytes) {
  return static_cast<UcxBatch&>(batch).reserve(static_cast<UcxEndpoint&>(ep), ops, put_bytes, get_bytes,
                                               [this](MessageOp& m) { send_message(m); });
}

void UcxTransport::send(TransportBatch& batch) { send_open(static_cast<UcxBatch&>(batch)); }

Status UcxTransport::fence(TransportBatch& batch, std::chrono::milliseconds) {
  // A message runs in order at its target: nothing to do for those.
  if (static_cast<UcxBatch&>(batch).m_requests.empty()) return Status();
  const ucs_status_t st = ucp_worker_fence(m_worker);
  return st == UCS_OK ? Status() : ucx_error("fence", st);
}

Status UcxTransport::wait(TransportBatch& batch, std::chrono::milliseconds timeout) {
  auto& b = static_cast<UcxBatch&>(batch);
  send_open(b);
  Status error;
  Status s = drive(b, timeout, &error);
  b.clear();
  return s.ok() ? error : s;
}

Status UcxTransport::flush(Endpoint& ep, std::chrono::milliseconds timeout) {
  auto& e = static_cast<UcxEndpoint&>(ep);
  if (e.failed()) return peer_failed();
  // A message operation completes only when the target has answered.
  if (e.m_messages) return Status();
  ucp_request_param_t p = one_sided_param();
  UcxBatch b;
  Status s = track(b, e, ucp_ep_flush_nbx(e.m_ep, &p), "flush");
  if (!s.ok()) return s;
  return wait(b, timeout);
}

Status UcxTransport::track(TransportBatch& batch, UcxEndpoint& ep, ucs_status_ptr_t request, const char* what) {
  if (request == nullptr) return Status();
  if (UCS_PTR_IS_ERR(request)) return ucx_error(std::string("issuing ") + what, UCS_PTR_STATUS(request));
  static_cast<UcxBatch&>(batch).m_requests.push_back({request, &ep});
  return Status();
}

// --- messages ----------------------------------------------------------------------

Status UcxTransport::add_op(TransportBatch& batch, UcxEndpoint& ep, const Op& op, const void* src, void* dst,
                            uint64_t* result) {
  auto m = static_cast<UcxBatch&>(batch).add_op(ep, op, dst, result, [this](MessageOp& full) { send_message(full); });
  if (!m.ok()) return m.status();
  if (op.kind == OpKind::put && op.length > 0) (*m)->payload.push_back({const_cast<void*>(src), op.length});
  return Status();
}

void UcxTransport::send_open(UcxBatch& b) {
  b.send_open([this](MessageOp& m) { send_message(m); });
}

Status UcxTransport::issue(UcxBatch& b, UcxEndpoint& ep, std::unique_ptr<MessageOp> op) {
  op->ep = &ep;
  op->waiter = &Waiter::of_this_thread();
  b.m_messages.push_back(std::move(op));
  b.m_is_done.push_back(false);
  send_message(*b.m_messages.back());
  return Status();
}

void UcxTransport::send_message(MessageOp& op) {
  const size_t ops_bytes = op.ops.size() * sizeof(Op);
  const bool in_header = op.header.kind == MessageKind::sequence && sizeof(MessageRequest) + ops_bytes <= m_max_header;
  if (op.header.kind == MessageKind::sequence) {
    op.header.ops = op.ops.size();
    if (in_header) {
      op.header.flags |= k_ops_in_header;
    } else {
      op.payload.insert(op.payload.begin(), {op.ops.data(), ops_bytes});
    }
    op.words.assign(op.ops.size(), 0);
    gather(op);
  }
  {
    std::lock_guard lock(m_ops_lock);
    op.header.id = ++m_next_op;
    m_ops.emplace(op.header.id, &op);
  }
  op.header.origin = m_origin;
  op.header.admission = op.ep->m_admission;
  if (op.ep->m_messages) op.header.flags |= k_answer_on_reply_ep;  // over TCP: on the connection it came by
  op.head.resize(sizeof(MessageRequest) + (in_header ? ops_bytes : 0));
  std::memcpy(op.head.data(), &op.header, sizeof op.header);
  if (in_header) std::memcpy(op.head.data() + sizeof op.header, op.ops.data(), ops_bytes);
  op.sent = true;
  m_requests_sent.fetch_add(1, std::memory_order_relaxed);
  post_request(op);
}

void UcxTransport::gather(MessageOp& op) {
  // Several puts (a client Batch's writes; a boundary message's header and
  // payload) go as one buffer up to 4 MiB: UCX 1.13 sends a scatter list
  // over TCP several times slower than one piece (64 writes of 4 KiB: 0.44
  // of a TCP stream as a list, 0.67 gathered; a 128-byte header and 1 MiB:
  // 743 us as two pieces, 489 us gathered; bench/batch_bench,
  // bench/remote_bench), and the copy costs less than that.
  if (op.payload.size() <= 1) return;
  size_t bytes = 0;
  for (const ucp_dt_iov_t& v : op.payload) bytes += v.length;
  if (bytes > k_gather_bytes) return;
  op.gathered.resize(bytes);
  std::byte* at = op.gathered.data();
  for (const ucp_dt_iov_t& v : op.payload) {
    std::memcpy(at, v.buffer, v.length);
    at += v.length;
  }
  op.payload.assign(1, {op.gathered.data(), bytes});
}

void UcxTransport::post_request(MessageOp& op) {
  op.sent_at = std::chrono::steady_clock::now();
  size_t bytes = 0;
  for (const ucp_dt_iov_t& v : op.payload) bytes += v.length;
  ucp_request_param_t p{};
  p.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS | UCP_OP_ATTR_FIELD_DATATYPE;
  // One buffer goes as it is (a rendezvous then sends it without a copy);
  // UCX takes no empty scatter list.
  const bool contiguous = op.payload.size() <= 1;
  p.datatype = contiguous ? ucp_dt_make_contig(1) : ucp_dt_make_iov();
  const void* buffer = contiguous ? (op.payload.empty() ? nullptr : op.payload[0].buffer) : op.payload.data();
  const size_t count = contiguous ? (op.payload.empty() ? 0 : op.payload[0].length) : op.payload.size();
  // Small ones inline; large ones by rendezvous over TCP (see
  // ucx_internal.hpp: eager always over shared memory).
  p.flags = bytes <= k_eager_limit || !op.ep->m_messages ? UCP_AM_SEND_FLAG_EAGER : UCP_AM_SEND_FLAG_RNDV;
  if (op.ep->m_messages) p.flags |= UCP_AM_SEND_FLAG_REPLY;
  // A failed endpoint sends nothing more (not the rest of a message begun
  // before it failed).
  void* request = op.ep->m_ep == nullptr || op.ep->failed() ? UCS_STATUS_PTR(UCS_ERR_CONNECTION_RESET)
                                         : ucp_am_send_nbx(op.ep->m_ep, k_request_id, op.head.data(), op.head.size(),
                                                           buffer, count, &p);
  if (UCS_PTR_IS_ERR(request)) {
    std::lock_guard lock(m_ops_lock);
    op.status = UCS_PTR_STATUS(request);
    op.replied = true;
  } else {
    op.send_request = request;
  }
}

// --- waiting -----------------------------------------------------------------------

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

Status UcxTransport::drive(UcxBatch& b, std::chrono::milliseconds timeout, Status* error) {
  using clock = std::chrono::steady_clock;
  const auto start = clock::now();
  const auto deadline = start + timeout;
  auto next_check = start + m_check_interval;
  const auto poll_for = m_spin.budget();
  Waiter& waiter = Waiter::of_this_thread();
  bool slept = false;
  auto last_news = start;
  for (;;) {
    const bool requests_left = reap_requests(b, *error);
    const bool messages_left = reap_messages(b, *error);
    const auto now = clock::now();
    if (!requests_left && !messages_left) {
      m_spin.record(now - start, std::min<clock::duration>(poll_for, now - start), slept);
      return Status();
    }
    if (ucp_worker_progress(m_worker) != 0) {
      last_news = now;
      continue;
    }
    // Poll while that pays (SpinPolicy); after a sleep, poll only while the
    // fabric keeps having news (the rest of a large answer, say).
    if (!slept ? now - start < poll_for : now - last_news < std::chrono::microseconds(5)) continue;
    if (m_wait_check && now > next_check) {
      if (Status s = check_waiting(b); !s.ok()) {
        abandon(b);
        return s;
      }
      next_check = clock::now() + m_check_interval;
    }
    if (now > deadline) {
      const std::string what = unfinished(b);
      abandon(b);
      return Status(ErrorCode::timeout, "remote operations did not complete within " +
                                            std::to_string(timeout.count()) + " ms (" + what + ")");
    }
    // Nothing moved: sleep until the fabric has news (the answer's bytes) or
    // another thread ran our answer's callback, bounded only by what must be
    // looked at then (the deadline, the reachability check, a message to
    // send again).
    auto until = std::min(deadline, now + (b.m_retry_soon ? std::chrono::milliseconds(k_busy_retry) : k_resend_after));
    if (m_wait_check) until = std::min(until, next_check);
    if (sleep(b, waiter, until, error)) slept = true;
    last_news = clock::now();
  }
}

bool UcxTransport::sleep(UcxBatch& b, Waiter& waiter, std::chrono::steady_clock::time_point until, Status* error) {
  // Announce the sleep, then look once more: an answer completed by another
  // thread before this store is seen by the look; one after it sees
  // `sleeping` and writes our wake fd (both sides seq_cst).
  waiter.sleeping.store(true, std::memory_order_seq_cst);
  const bool left = reap_requests(b, *error) | reap_messages(b, *error);
  if (!left || ucp_worker_arm(m_worker) != UCS_OK) {
    waiter.sleeping.store(false, std::memory_order_relaxed);
    return false;
  }
  const auto left_ms = std::chrono::ceil<std::chrono::milliseconds>(until - std::chrono::steady_clock::now());
  pollfd fds[2] = {{m_efd, POLLIN, 0}, {waiter.fd, POLLIN, 0}};
  (void)::poll(fds, 2, static_cast<int>(std::max<int64_t>(0, left_ms.count())));
  waiter.sleeping.store(false, std::memory_order_relaxed);
  if (fds[1].revents != 0) waiter.drain();
  return true;
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
  b.m_retry_soon = false;
  for (size_t i = 0; i < b.m_messages.size(); ++i) {
    if (b.m_is_done[i]) continue;
    MessageOp& op = *b.m_messages[i];
    if (!op.sent) continue;
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
      const auto now = std::chrono::steady_clock::now();
      if (op.replied && op.refusal == Refusal::busy) {
        // The target had no room to stage it: ask again shortly.
        resend = now - op.sent_at > k_busy_retry;
        if (!resend) {
          b.m_retry_soon = true;
          continue;
        }
        op.replied = false;
        op.refusal = Refusal::none;
      }
      // Unanswered for long: the request or its answer was lost (UCX 1.13
      // over shared memory now and then drops an answer sent on the reply
      // endpoint). Ask again; the target runs a message with effects only
      // once.
      resend = resend || (!op.replied && op.recv_request == nullptr &&
                          now - op.sent_at > k_resend_after * (1 << std::min(op.resends, 3)));
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
    if (!result.ok()) continue;
    if (op.status != UCS_OK && op.refusal == Refusal::none) {
      result = ucx_error("remote operation", op.status);
    } else {
      result = answer_status(op.refusal, op.refused_op, op.ops, op.aborted, op.ran);
    }
  }
  return b.m_done < b.m_messages.size();
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
    if (b.m_is_done[i] || !op.sent) continue;
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

// --- answers -----------------------------------------------------------------------

void UcxTransport::deliver_words(MessageOp& op) {
  // The operations that ran, and the one that stopped the message.
  const size_t n = std::min<size_t>(op.ops.size(), op.ran + (op.aborted ? 1 : 0));
  for (size_t i = 0; i < n; ++i) {
    if (op.result[i] != nullptr) *op.result[i] = op.words[i];
  }
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
  if (op.replied || op.recv_request != nullptr) return UCS_OK;
  Waiter* waiter = op.waiter;
  auto finish = [&] {
    op.replied = true;
    waiter->wake();
    return UCS_OK;
  };
  if (r.refusal != Refusal::none) {
    op.refusal = r.refusal;
    op.refused_op = r.refused_op;
    return finish();
  }
  if (op.header.kind != MessageKind::sequence) return finish();  // hello
  op.ran = std::min<uint32_t>(r.ran, static_cast<uint32_t>(op.ops.size()));
  op.aborted = (r.flags & k_reply_aborted) != 0 && op.ran < op.ops.size();
  const size_t words = op.ops.size() * sizeof(uint64_t);
  const size_t gets = sequence::get_bytes(op.ops, op.ran);
  if (length != words + gets) {
    op.status = UCS_ERR_MESSAGE_TRUNCATED;
    return finish();
  }
  if ((param->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV) == 0) {
    const auto* in = static_cast<const std::byte*>(data);
    std::memcpy(op.words.data(), in, words);
    in += words;
    for (size_t i = 0; i < op.ran; ++i) {
      if (op.ops[i].kind != OpKind::get) continue;
      std::memcpy(op.dst[i], in, op.ops[i].length);
      in += op.ops[i].length;
    }
    deliver_words(op);
    return finish();
  }
  // A large answer lands straight in the gets' buffers.
  op.landing.clear();
  op.landing.push_back({op.words.data(), words});
  for (size_t i = 0; i < op.ran; ++i) {
    if (op.ops[i].kind == OpKind::get && op.ops[i].length > 0) op.landing.push_back({op.dst[i], op.ops[i].length});
  }
  ucp_request_param_t p{};
  p.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA | UCP_OP_ATTR_FIELD_DATATYPE;
  p.cb.recv_am = &UcxTransport::on_reply_landed;
  p.user_data = &op;
  p.datatype = ucp_dt_make_iov();
  void* request = ucp_am_recv_data_nbx(self.m_worker, data, op.landing.data(), op.landing.size(), &p);
  if (request == nullptr) {
    deliver_words(op);
    return finish();
  }
  if (UCS_PTR_IS_ERR(request)) {
    op.status = UCS_PTR_STATUS(request);
    return finish();
  }
  op.recv_request = request;
  return UCS_OK;
}

void UcxTransport::on_reply_landed(void* request, ucs_status_t status, size_t, void* user_data) {
  auto& op = *static_cast<MessageOp*>(user_data);
  {
    // The waiter is told under the lock: once it sees `replied` it may free
    // the operation.
    std::lock_guard lock(op.ep->m_owner.m_ops_lock);
    if (status != UCS_OK && op.status == UCS_OK) op.status = status;
    if (status == UCS_OK) deliver_words(op);
    op.replied = true;
    op.recv_request = nullptr;
    op.waiter->wake();
  }
  ucp_request_free(request);
}

}  // namespace tiermem::ucx_detail
