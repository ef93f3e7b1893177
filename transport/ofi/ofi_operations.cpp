// The asking side of the libfabric transport: operations collected into one
// message per endpoint and batch, sent as tagged messages, waited for
// (polling, then sleeping on the completion queue's fd or in short steps
// where the provider has none), and what a timeout leaves behind. See
// ofi_internal.hpp.
#include <poll.h>
#include <sched.h>

#include <algorithm>
#include <cstring>
#include <set>

#include "transport/ofi/ofi_internal.hpp"
#include "transport/ofi/ofi_loader.hpp"

namespace tiermem::ofi_detail {

using transport_detail::answer_status;
using transport_detail::make_op;

namespace {
Status not_on_messages(const char* what) {
  return Status(ErrorCode::not_supported, std::string(what) + " needs the message path; this key is one-sided");
}
}  // namespace

Status OfiTransport::get(TransportBatch& batch, Endpoint& ep, void* dst, size_t length, uint64_t remote_addr,
                         RemoteKey& key) {
  auto& k = static_cast<OfiRemoteKey&>(key);
  auto& e = static_cast<OfiEndpoint&>(ep);
  if (k.m_one_sided) return rma_get(static_cast<OfiBatch&>(batch), e, dst, length, remote_addr, k);
  return add_op(batch, e, make_op(OpKind::get, remote_addr, length, k.m_token), nullptr, dst, nullptr);
}

Status OfiTransport::put(TransportBatch& batch, Endpoint& ep, const void* src, size_t length, uint64_t remote_addr,
                         RemoteKey& key) {
  auto& k = static_cast<OfiRemoteKey&>(key);
  auto& e = static_cast<OfiEndpoint&>(ep);
  if (k.m_one_sided) return rma_put(static_cast<OfiBatch&>(batch), e, src, length, remote_addr, k);
  return add_op(batch, e, make_op(OpKind::put, remote_addr, length, k.m_token), src, nullptr, nullptr);
}

Status OfiTransport::atomic(TransportBatch& batch, Endpoint& ep, AtomicOp op, uint64_t operand, uint64_t compare,
                            uint64_t remote_addr, RemoteKey& key, uint64_t* result) {
  auto& k = static_cast<OfiRemoteKey&>(key);
  if (k.m_one_sided) {
    return rma_atomic(static_cast<OfiBatch&>(batch), static_cast<OfiEndpoint&>(ep), op, operand, compare, remote_addr,
                      k, result);
  }
  Op m = make_op(OpKind::atomic, remote_addr, sizeof(uint64_t), k.m_token);
  m.atomic_op = static_cast<uint8_t>(op);
  m.operand = operand;
  m.compare = compare;
  return add_op(batch, static_cast<OfiEndpoint&>(ep), m, nullptr, nullptr, result);
}

Status OfiTransport::add_if(TransportBatch& batch, Endpoint& ep, WordCondition condition, uint64_t add, uint64_t undo,
                            uint64_t remote_addr, RemoteKey& key, uint64_t* old) {
  if (one_sided(key)) return not_on_messages("a conditional add");
  Op m = make_op(OpKind::add_if, remote_addr, sizeof(uint64_t), static_cast<OfiRemoteKey&>(key).m_token);
  m.operand = add;
  m.compare = condition.mask;
  m.value = condition.value;
  m.undo = undo;
  return add_op(batch, static_cast<OfiEndpoint&>(ep), m, nullptr, nullptr, old);
}

Status OfiTransport::persist(TransportBatch& batch, Endpoint& ep, uint64_t remote_addr, size_t length,
                             RemoteKey& key) {
  if (one_sided(key)) return not_on_messages("a persist");
  return add_op(batch, static_cast<OfiEndpoint&>(ep),
                make_op(OpKind::persist, remote_addr, length, static_cast<OfiRemoteKey&>(key).m_token), nullptr,
                nullptr, nullptr);
}

Status OfiTransport::end_group(TransportBatch& batch, Endpoint& ep, uint64_t* stopped) {
  return add_op(batch, static_cast<OfiEndpoint&>(ep), make_op(OpKind::group_end, 0, 0, 0), nullptr, nullptr, stopped);
}

Status OfiTransport::barrier(TransportBatch& batch, Endpoint& ep, uint64_t* stopped) {
  return add_op(batch, static_cast<OfiEndpoint&>(ep), make_op(OpKind::barrier, 0, 0, 0), nullptr, nullptr, stopped);
}

Status OfiTransport::reserve(TransportBatch& batch, Endpoint& ep, size_t ops, size_t put_bytes, size_t get_bytes) {
  return static_cast<OfiBatch&>(batch).reserve(static_cast<OfiEndpoint&>(ep), ops, put_bytes, get_bytes,
                                               [this](OfiMessage& m) { send_message(m); });
}

Status OfiTransport::wait(TransportBatch& batch, std::chrono::milliseconds timeout) {
  auto& b = static_cast<OfiBatch&>(batch);
  send_open(b);
  Status error;
  Status s = drive(b, timeout, &error);
  b.clear();
  return s.ok() ? error : s;
}

Status OfiTransport::flush(Endpoint& ep, std::chrono::milliseconds) {
  // A message completes only when the target has answered it.
  if (ep.failed()) return Status(ErrorCode::transport_error, "the peer's endpoint failed (peer down or unreachable)");
  return Status();
}

// --- collecting and sending ---------------------------------------------------------

Status OfiTransport::add_op(TransportBatch& batch, OfiEndpoint& ep, const Op& op, const void* src, void* dst,
                            uint64_t* result) {
  auto m = static_cast<OfiBatch&>(batch).add_op(ep, op, dst, result, [this](OfiMessage& full) { send_message(full); });
  if (!m.ok()) return m.status();
  (*m)->src.push_back(src);
  return Status();
}

void OfiTransport::send_open(OfiBatch& b) {
  b.send_open([this](OfiMessage& m) { send_message(m); });
}

void OfiTransport::send_message(OfiMessage& m) {
  MessageRequest& h = m.head.request;
  h.id = m_next_id.fetch_add(1, std::memory_order_relaxed) & k_id_mask;
  h.origin = m_origin;
  h.admission = m.ep->m_admission;
  const size_t ops_bytes = m.ops.size() * sizeof(Op);
  // The request: head, operations, and the puts when all of it fits a
  // posted request buffer; else the puts follow as the payload. Either way
  // copied now: the provider never reads the caller's buffers, which may be
  // gone when a wait gave up (ofi_internal.hpp).
  std::vector<std::byte>* puts_into = &m.wire;
  if (h.kind == MessageKind::sequence) {
    h.ops = m.ops.size();
    h.flags = k_ops_in_header;
    const bool inline_puts = sizeof(OfiHead) + ops_bytes + m.put_bytes <= k_request_buffer;
    m.head.payload_bytes = inline_puts ? 0 : m.put_bytes;
    m.wire.resize(sizeof(OfiHead) + ops_bytes + (inline_puts ? m.put_bytes : 0));
    std::memcpy(m.wire.data() + sizeof(OfiHead), m.ops.data(), ops_bytes);
    if (!inline_puts) {
      m.payload.resize(m.put_bytes);
      puts_into = &m.payload;
    }
    std::byte* at = puts_into->data() + (inline_puts ? sizeof(OfiHead) + ops_bytes : 0);
    for (size_t i = 0; i < m.ops.size(); ++i) {
      if (m.ops[i].kind != OpKind::put || m.ops[i].length == 0) continue;
      std::memcpy(at, m.src[i], m.ops[i].length);
      at += m.ops[i].length;
    }
    m.answer = m_pool.take(sizeof(MessageReply) + sequence::answer_bytes(m.ops));
  } else {
    // hello: our endpoint's name, for the target to answer us by.
    m.wire.resize(sizeof(OfiHead) + m_name.size());
    std::memcpy(m.wire.data() + sizeof(OfiHead), m_name.data(), m_name.size());
    m.answer = m_pool.take(sizeof(MessageReply));
  }
  std::memcpy(m.wire.data(), &m.head, sizeof m.head);
  m.sent = true;
  m_requests_sent.fetch_add(1, std::memory_order_relaxed);
  post_message(m);
}

ssize_t OfiTransport::post_retrying(const std::function<ssize_t()>& post, std::chrono::steady_clock::time_point until) {
  for (;;) {
    const ssize_t rc = post();
    // -FI_EAGAIN: the provider's queues are full, or (rxm) the connection to
    // a new peer is still being made; both move on with progress.
    if (rc != -FI_EAGAIN || std::chrono::steady_clock::now() > until) return rc;
    progress_once();
  }
}

void OfiTransport::post_message(OfiMessage& m) {
  m.sent_at = std::chrono::steady_clock::now();
  const auto until = m.sent_at + std::chrono::seconds(5);
  const uint64_t id = m.head.request.id;
  const fi_addr_t to = m.ep->m_addr;
  auto fail = [&](const char* what, ssize_t rc) {
    std::lock_guard lock(m_lock);
    if (m.status.ok()) m.status = ofi_error(std::string("posting ") + what, static_cast<int>(rc));
  };
  if (m.ep->failed()) {
    std::lock_guard lock(m_lock);
    m.status = Status(ErrorCode::transport_error, "the peer's endpoint failed (peer down or unreachable)");
    return;
  }
  {
    std::lock_guard lock(m_lock);
    m.outstanding = 0;
    m.answered = false;
    m.answer_posted = false;
    m.cancel_asked = false;
  }
  // The answer's receive first: it is never unexpected at our end.
  ssize_t rc = post_retrying(
      [&] {
        std::lock_guard lock(m_lock);
        const ssize_t r = fi_trecv(m_ep, m.answer.data(), m.answer.size(), nullptr, m_directed ? to : FI_ADDR_UNSPEC,
                                   k_tag_answer | id, 0, &m.answer_ctx.fi);
        if (r == 0) {
          ++m.outstanding;
          m.answer_posted = true;
        }
        return r;
      },
      until);
  if (rc != 0) return fail("the answer's receive", rc);
  auto send = [&](OfiContext& ctx, const std::vector<std::byte>& bytes, uint64_t tag) {
    return post_retrying(
        [&] {
          std::lock_guard lock(m_lock);
          const ssize_t r = fi_tsend(m_ep, bytes.data(), bytes.size(), nullptr, to, tag, &ctx.fi);
          if (r == 0) ++m.outstanding;
          return r;
        },
        until);
  };
  rc = send(m.send_ctx, m.wire, k_tag_request);
  if (rc == 0 && m.head.payload_bytes > 0) rc = send(m.payload_ctx, m.payload, k_tag_payload | id);
  if (rc != 0) {
    fail("the request", rc);
    std::lock_guard lock(m_lock);
    m.cancel_asked = true;
    fi_cancel(&m_ep->fid, &m.answer_ctx.fi);
  }
}

// --- waiting ------------------------------------------------------------------------

Status OfiTransport::drive(OfiBatch& b, std::chrono::milliseconds timeout, Status* error) {
  using clock = std::chrono::steady_clock;
  const auto start = clock::now();
  const auto deadline = start + timeout;
  auto next_check = start + m_check_interval;
  const auto poll_for = m_spin.budget();
  Waiter& waiter = Waiter::of_this_thread();
  bool slept = false;
  auto last_news = start;
  unsigned idle_polls = 0;
  for (;;) {
    const bool left = reap(b, *error) | reap_rma(b, *error);
    const auto now = clock::now();
    if (!left) {
      m_spin.record(now - start, std::min<clock::duration>(poll_for, now - start), slept);
      return Status();
    }
    if (progress_once()) {
      last_news = now;
      continue;
    }
    if (!slept ? now - start < poll_for : now - last_news < std::chrono::microseconds(5)) continue;
    if (m_cq_fd < 0 && now - last_news < k_no_fd_spin) {
      // Nothing to sleep on (shm, efa, cxi): poll on for a while, letting
      // the peer have the core now and then (two cores: it may need ours).
      if (++idle_polls % 16 == 0) ::sched_yield();
      continue;
    }
    if (now > next_check) {
      check_peers(b);
      if (m_wait_check) {
        if (Status s = check_waiting(b); !s.ok()) {
          abandon(b);
          return s;
        }
      }
      next_check = clock::now() + m_check_interval;
    }
    if (now > deadline) {
      const std::string what = unfinished(b);
      abandon(b);
      return Status(ErrorCode::timeout, "remote operations did not complete within " +
                                            std::to_string(timeout.count()) + " ms (" + what + ")");
    }
    auto until = std::min({deadline, next_check, now + (b.m_retry_soon ? k_busy_retry : std::chrono::milliseconds(100))});
    if (sleep(b, waiter, until, error)) slept = true;
    last_news = clock::now();
  }
}

bool OfiTransport::sleep(OfiBatch& b, Waiter& waiter, std::chrono::steady_clock::time_point until, Status* error) {
  // As UcxTransport::sleep: announce the sleep, look once more, then sleep
  // until the fabric (the CQ's fd) or another thread that ran our
  // completion (the waiter's fd) wakes us.
  waiter.sleeping.store(true, std::memory_order_seq_cst);
  if (!(reap(b, *error) | reap_rma(b, *error))) {
    waiter.sleeping.store(false, std::memory_order_relaxed);
    return false;
  }
  if (m_cq_fd < 0) {
    // No fd to sleep on (shm, efa, cxi): a short nap; this thread is what
    // progresses its own answers (clients have no progress thread).
    ::usleep(50);
    waiter.sleeping.store(false, std::memory_order_relaxed);
    return true;
  }
  fid* f = &m_cq->fid;
  if (fi_trywait(m_fabric, &f, 1) != FI_SUCCESS) {  // completions to read first
    waiter.sleeping.store(false, std::memory_order_relaxed);
    return false;
  }
  const auto left = std::chrono::ceil<std::chrono::milliseconds>(until - std::chrono::steady_clock::now());
  pollfd fds[2] = {{waiter.fd, POLLIN, 0}, {m_cq_fd, POLLIN, 0}};
  (void)::poll(fds, 2, static_cast<int>(std::max<int64_t>(0, left.count())));
  waiter.sleeping.store(false, std::memory_order_relaxed);
  if (fds[0].revents != 0) waiter.drain();
  return true;
}

bool OfiTransport::reap(OfiBatch& b, Status& result) {
  b.m_retry_soon = false;
  for (size_t i = 0; i < b.m_messages.size(); ++i) {
    if (b.m_is_done[i]) continue;
    OfiMessage& m = *b.m_messages[i];
    if (!m.sent) continue;
    {
      std::lock_guard lock(m_lock);
      if (m.outstanding > 0) {
        // A failed peer answers nothing: take back the answer's receive.
        if (m.ep->failed() && m.answer_posted && !m.cancel_asked) {
          m.cancel_asked = true;
          fi_cancel(&m_ep->fid, &m.answer_ctx.fi);
        }
        continue;
      }
    }
    // Nothing of it is with the provider now: the waiting thread owns it.
    if (m.status.ok() && m.answered && m.answer_length >= sizeof(MessageReply)) {
      MessageReply r;
      std::memcpy(&r, m.answer.data(), sizeof r);
      if (r.magic == k_message_magic && r.refusal == Refusal::busy) {
        // The target had no room to stage it: ask again shortly.
        if (std::chrono::steady_clock::now() - m.sent_at < k_busy_retry) {
          b.m_retry_soon = true;
          continue;
        }
        post_message(m);
        continue;
      }
    }
    b.m_is_done[i] = true;
    ++b.m_done;
    finish(m, result);
  }
  return b.m_done < b.m_messages.size();
}

void OfiTransport::finish(OfiMessage& m, Status& result) {
  Status s = m.status;
  if (s.ok() && !m.answered) s = Status(ErrorCode::transport_error, "the peer's endpoint failed (peer down or unreachable)");
  MessageReply r;
  if (s.ok()) {
    std::memcpy(&r, m.answer.data(), sizeof r);
    if (r.magic != k_message_magic || r.origin != m_origin || r.id != m.head.request.id) {
      s = Status(ErrorCode::transport_error, "an answer that is not to this request");
    }
  }
  if (s.ok() && r.refusal == Refusal::none && m.head.request.kind == MessageKind::sequence) {
    const uint32_t ran = std::min<uint32_t>(r.ran, static_cast<uint32_t>(m.ops.size()));
    const bool aborted = (r.flags & k_reply_aborted) != 0 && ran < m.ops.size();
    const size_t words = m.ops.size() * sizeof(uint64_t);
    if (m.answer_length != sizeof r + words + sequence::get_bytes(m.ops, ran)) {
      s = Status(ErrorCode::transport_error, "an answer of " + std::to_string(m.answer_length) +
                                                 " bytes, not what its request asked for");
    } else {
      const std::byte* in = m.answer.data() + sizeof r;
      // The operations that ran, and the one that stopped the message.
      const size_t n = std::min<size_t>(m.ops.size(), ran + (aborted ? 1 : 0));
      for (size_t i = 0; i < n; ++i) {
        uint64_t word;
        std::memcpy(&word, in + i * sizeof word, sizeof word);
        if (m.result[i] != nullptr) *m.result[i] = word;
      }
      in += words;
      for (size_t i = 0; i < ran; ++i) {
        if (m.ops[i].kind != OpKind::get) continue;
        std::memcpy(m.dst[i], in, m.ops[i].length);
        in += m.ops[i].length;
      }
      s = answer_status(Refusal::none, 0, m.ops, aborted, ran);
    }
  } else if (s.ok()) {
    s = answer_status(r.refusal, r.refused_op, m.ops, false, 0);
  }
  if (result.ok()) result = std::move(s);
}

Status OfiTransport::check_waiting(OfiBatch& b) {
  std::set<OfiEndpoint*> eps;
  for (size_t i = 0; i < b.m_messages.size(); ++i) {
    if (!b.m_is_done[i]) eps.insert(b.m_messages[i]->ep);
  }
  for (const auto& r : b.m_rma) {
    if (!r->reaped) eps.insert(r->ep);
  }
  for (OfiEndpoint* ep : eps) {
    if (Status s = m_wait_check(*ep); !s.ok()) {
      ep->m_failed.store(true, std::memory_order_release);
      return s;
    }
  }
  return Status();
}

void OfiTransport::check_peers(OfiBatch& b) {
  const auto now = std::chrono::steady_clock::now();
  auto check = [&](OfiEndpoint* ep, std::chrono::steady_clock::time_point sent_at) {
    if (ep->failed()) return;
    if (ep->m_pidfd >= 0) {
      if (ep->exited()) report_failure(*ep, OfiEndpoint::k_exited);
    } else if (now - sent_at > k_ping_after) {
      ping(*ep);
    }
  };
  for (size_t i = 0; i < b.m_messages.size(); ++i) {
    const OfiMessage& m = *b.m_messages[i];
    if (!b.m_is_done[i] && m.sent) check(m.ep, m.sent_at);
  }
  for (const auto& r : b.m_rma) {
    if (!r->reaped) check(r->ep, r->sent_at);
  }
}

void OfiTransport::ping(OfiEndpoint& ep) {
  if (ep.m_pinging.exchange(true)) return;
  auto p = std::make_unique<Ping>();
  p->head.request.kind = MessageKind::ping;
  p->head.request.origin = m_origin;
  p->head.request.admission = ep.m_admission;
  p->ep = ep.weak_from_this();
  Ping* raw = p.get();
  std::string failure;
  {
    std::lock_guard lock(m_lock);
    const ssize_t rc = fi_tsend(m_ep, &raw->head, sizeof raw->head, nullptr, ep.m_addr, k_tag_request, &raw->ctx.fi);
    if (rc == 0) {
      ep.m_blocked_since = {};
      m_pings.emplace(raw, std::move(p));
      return;
    }
    ep.m_pinging.store(false);
    // tcp;ofi_rxm, once the connection to a peer broke, refuses every send
    // to it (-FI_EAGAIN while it tries to connect again) and reports nothing
    // else. A 48-byte send refused for k_ping_blocked while answers are late
    // means the peer is gone; a live peer, even a stopped one, takes it.
    const auto now = std::chrono::steady_clock::now();
    if (rc != -FI_EAGAIN) {
      failure = std::string("a send to it failed: ") + api().strerror(static_cast<int>(-rc));
    } else if (ep.m_blocked_since == std::chrono::steady_clock::time_point{}) {
      ep.m_blocked_since = now;
    } else if (now - ep.m_blocked_since > k_ping_blocked) {
      failure = "no send to it has been taken for " + std::to_string(k_ping_blocked.count()) +
                " ms while its answers are late (the connection broke)";
    }
  }
  if (!failure.empty()) report_failure(ep, failure);
}

std::string OfiTransport::unfinished(OfiBatch& b) {
  size_t unanswered = 0, sending = 0;
  std::lock_guard lock(m_lock);
  for (size_t i = 0; i < b.m_messages.size(); ++i) {
    if (b.m_is_done[i]) continue;
    const OfiMessage& m = *b.m_messages[i];
    if (m.outstanding > (m.answer_posted ? 1 : 0)) ++sending;
    else ++unanswered;
  }
  return std::to_string(b.m_rma.size() - b.m_rma_done) + " one-sided, " + std::to_string(sending) +
         " request(s) being sent, " + std::to_string(unanswered) + " unanswered";
}

void OfiTransport::abandon(OfiBatch& b) {
  // What the provider still holds (a send of the request, the answer's
  // receive) goes to quarantine with its message until its completion or
  // cancellation comes; the caller's buffers were never given to it. The
  // endpoints count as failed from now on (a client reconnects).
  std::lock_guard lock(m_lock);
  for (size_t i = 0; i < b.m_messages.size(); ++i) {
    if (b.m_is_done[i]) continue;
    OfiMessage& m = *b.m_messages[i];
    m.ep->m_failed.store(true, std::memory_order_release);
    m.abandoned = true;
    if (m.outstanding == 0) continue;
    if (m.answer_posted && !m.cancel_asked) {
      m.cancel_asked = true;
      fi_cancel(&m_ep->fid, &m.answer_ctx.fi);
    }
    m.ep = nullptr;  // may be gone before the completions come
    m_quarantine.emplace(&m, std::move(b.m_messages[i]));
  }
  for (auto& r : b.m_rma) {
    if (r->done || r->reaped) continue;
    r->ep->m_failed.store(true, std::memory_order_release);
    r->abandoned = true;
    r->ep = nullptr;
    m_rma_quarantine.emplace(r.get(), std::move(r));
  }
  b.m_open.clear();
  b.m_messages.clear();
  b.m_is_done.clear();
  b.m_done = 0;
  b.m_rma.clear();
  b.m_rma_done = 0;
}

}  // namespace tiermem::ofi_detail
