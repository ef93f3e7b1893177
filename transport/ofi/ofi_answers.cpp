// The libfabric transport's completion queue and the target side of its
// messages: requests checked whole, run on our memory in order (one with
// effects once, however often it is asked: transport/message_target.hpp) and
// answered to the asker's address; and the progress thread that answers while
// nobody of this process waits. See ofi_internal.hpp.
#include <poll.h>
#include <sched.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <string_view>

#include "transport/ofi/ofi_internal.hpp"
#include "transport/ofi/ofi_loader.hpp"
#include "transport/ofi/ofi_shm_files.hpp"

namespace tiermem::ofi_detail {

using transport_detail::run_request;
using transport_detail::TargetAnswer;

// tcp;ofi_rxm reports a killed peer's operations in flight as FI_ECANCELED
// with the socket's errno.
bool peer_failed(int error, int prov_errno) {
  switch (error) {
    case FI_EIO:
    case FI_ENOTCONN:
    case FI_ECONNRESET:
    case FI_ECONNREFUSED:
    case FI_ECONNABORTED:
    case FI_EHOSTUNREACH:
    case FI_ENETUNREACH:
    case FI_ETIMEDOUT:
    case EPIPE:  // FI_ errors are errno values; libfabric 1.17 names no FI_EPIPE
      return true;
    case FI_ECANCELED:
      return prov_errno == ENOTCONN || prov_errno == ECONNRESET || prov_errno == EPIPE;
    default:
      return false;
  }
}

bool OfiTransport::progress_once() {
  fi_cq_tagged_entry entries[16];
  const ssize_t n = fi_cq_read(m_cq, entries, 16);
  bool news = false;
  if (n > 0) {
    for (ssize_t i = 0; i < n; ++i) {
      complete(static_cast<OfiContext*>(entries[i].op_context), entries[i].len, 0, 0, "");
    }
    news = true;
  } else if (n == -FI_EAVAIL) {
    fi_cq_err_entry err{};
    if (fi_cq_readerr(m_cq, &err, 0) > 0) {
      const int error = err.err < 0 ? -err.err : err.err;  // shm gave -5
      char buf[128] = {};
      const char* detail = fi_cq_strerror(m_cq, err.prov_errno, err.err_data, buf, sizeof buf);
      std::string why = std::string(api().strerror(error)) + " (" + (detail != nullptr ? detail : "") + ")";
      complete(static_cast<OfiContext*>(err.op_context), err.len, error, err.prov_errno, why);
      news = true;
    }
  }
  return run_deferred() || news;
}

void OfiTransport::complete(OfiContext* ctx, size_t length, int error, int prov_errno, const std::string& why) {
  if (ctx == nullptr) return;
  switch (ctx->kind) {
    case ContextKind::request_buffer: {
      auto* buffer = static_cast<RequestBuffer*>(ctx->owner);
      if (error == 0) on_request(buffer->bytes.get(), length);
      // A request too large for the buffer (FI_ETRUNC) is dropped; its asker
      // never got the address of a peer that would send one.
      if (!m_stop.load(std::memory_order_relaxed)) post_request_buffer(buffer);
      return;
    }
    case ContextKind::landing: {
      std::unique_ptr<Landing> landing;
      {
        std::lock_guard lock(m_lock);
        auto it = m_landings.find(static_cast<Landing*>(ctx->owner));
        if (it == m_landings.end()) return;
        landing = std::move(it->second);
        m_landings.erase(it);
      }
      // All of the payload arrived: run it. Else its asker died mid-send, or
      // it was a refused request's payload: nothing runs.
      const size_t bytes = landing->bytes.size();
      if (error == 0 && !landing->discard && length == bytes) {
        run(landing->from, landing->request, landing->ops, landing->bytes.data(), bytes);
      }
      if (!landing->discard) m_staged.fetch_sub(bytes);
      return;
    }
    case ContextKind::ping: {
      std::unique_ptr<Ping> ping;
      {
        std::lock_guard lock(m_lock);
        auto it = m_pings.find(static_cast<Ping*>(ctx->owner));
        if (it == m_pings.end()) return;
        ping = std::move(it->second);
        m_pings.erase(it);
      }
      if (auto ep = ping->ep.lock()) {
        ep->m_pinging.store(false);
        if (error != 0 && peer_failed(error, prov_errno)) report_failure(*ep, why);
      }
      return;
    }
    case ContextKind::rma:
      complete_rma(ctx, error, prov_errno, why);
      return;
    case ContextKind::answer_send: {
      std::lock_guard lock(m_lock);
      m_sendings.erase(static_cast<Sending*>(ctx->owner));  // a dead asker only fails the send
      return;
    }
    default:
      complete_message(ctx, length, error, prov_errno, why);
  }
}

void OfiTransport::complete_message(OfiContext* ctx, size_t length, int error, int prov_errno,
                                    const std::string& why) {
  OfiEndpoint* failed = nullptr;
  {
    std::lock_guard lock(m_lock);
    OfiMessage& m = *static_cast<OfiMessage*>(ctx->owner);
    --m.outstanding;
    if (ctx->kind == ContextKind::message_answer) {
      m.answer_posted = false;
      if (error == 0) {
        m.answered = true;
        m.answer_length = length;
      }
    }
    if (error != 0 && m.status.ok()) {
      if (error == FI_ECANCELED && m.cancel_asked) {
        m.status = Status(ErrorCode::transport_error, "the peer's endpoint failed (peer down or unreachable)");
      } else {
        m.status = Status(ErrorCode::transport_error, "libfabric: " + why);
        if (peer_failed(error, prov_errno) && !m.abandoned) failed = m.ep;
      }
    }
    // A request that did not go out is answered by nobody.
    if (error != 0 && ctx->kind != ContextKind::message_answer && m.answer_posted && !m.cancel_asked) {
      m.cancel_asked = true;
      fi_cancel(&m_ep->fid, &m.answer_ctx.fi);
    }
    if (m.abandoned) {
      if (m.outstanding == 0) m_quarantine.erase(&m);  // the provider let go of its buffers
      return;
    }
    if (m.outstanding == 0 || error != 0) m.waiter->wake();
  }
  if (failed != nullptr) report_failure(*failed, why);
}

void OfiTransport::post_request_buffer(RequestBuffer* buffer) {
  // Never given up: without its request buffers the target serves nobody.
  auto post = [this, buffer](bool) {
    return fi_trecv(m_ep, buffer->bytes.get(), k_request_buffer, nullptr, FI_ADDR_UNSPEC, k_tag_request, 0,
                    &buffer->ctx.fi) != -FI_EAGAIN;
  };
  if (!post(false)) post_later(post);
}

void OfiTransport::on_request(const std::byte* data, size_t length) {
  OfiHead head;
  if (length < sizeof head) return;  // not ours
  std::memcpy(&head, data, sizeof head);
  const MessageRequest& h = head.request;
  if (h.magic != k_message_magic) return;
  if (h.kind == MessageKind::hello) return on_hello(head, data + sizeof head, length - sizeof head);
  if (h.kind == MessageKind::ping) return;  // it only had to arrive
  const fi_addr_t from = origin_addr(h.origin);
  // No hello from it: nowhere to answer (and nothing runs).
  if (from == FI_ADDR_NOTAVAIL) return;
  // Refused before anything is staged: nothing of the message runs, and a
  // payload is received only to be dropped.
  const size_t ops_bytes = h.ops * sizeof(Op);
  Refusal refusal = Refusal::none;
  if (h.admission != m_admission) {
    refusal = Refusal::unadmitted;
  } else if (h.kind != MessageKind::sequence || h.ops == 0 || (h.flags & k_ops_in_header) == 0) {
    refusal = Refusal::malformed;
  } else if (h.ops > sequence::k_max_ops || head.payload_bytes > sequence::k_max_bytes) {
    refusal = Refusal::too_large;
  } else if (length < sizeof head + ops_bytes || (head.payload_bytes > 0 && length != sizeof head + ops_bytes)) {
    refusal = Refusal::malformed;
  } else if (head.payload_bytes > 0 && m_staged.fetch_add(head.payload_bytes) + head.payload_bytes > k_staging_limit) {
    m_staged.fetch_sub(head.payload_bytes);
    refusal = Refusal::busy;  // the asker asks again shortly
  }
  if (refusal != Refusal::none) {
    refuse(from, h, refusal);
    if (head.payload_bytes > 0) discard_payload(from, h.id);
    return;
  }
  std::vector<Op> ops(h.ops);  // the buffer need not be aligned for Op
  std::memcpy(ops.data(), data + sizeof head, ops_bytes);
  if (head.payload_bytes == 0) {
    run(from, h, ops, data + sizeof head + ops_bytes, length - sizeof head - ops_bytes);
    return;
  }
  auto landing = std::make_unique<Landing>();
  landing->from = from;
  landing->request = h;
  landing->ops = std::move(ops);
  landing->bytes = m_pool.take(head.payload_bytes);
  Landing* l = landing.get();
  {
    std::lock_guard lock(m_lock);
    m_landings.emplace(l, std::move(landing));
  }
  const uint64_t tag = k_tag_payload | (h.id & k_id_mask);
  auto post = [this, l, from, tag](bool give_up) {
    std::lock_guard lock(m_lock);
    const ssize_t r = give_up ? -FI_ECANCELED
                              : fi_trecv(m_ep, l->bytes.data(), l->bytes.size(), nullptr,
                                         m_directed ? from : FI_ADDR_UNSPEC, tag, 0, &l->ctx.fi);
    if (r == -FI_EAGAIN) return false;
    if (r != 0) {
      m_staged.fetch_sub(l->bytes.size());
      m_landings.erase(l);
    }
    return true;
  };
  if (!post(false)) post_later(post);
}

void OfiTransport::run(fi_addr_t from, const MessageRequest& request, const std::vector<Op>& ops,
                       const std::byte* puts, size_t length) {
  TargetAnswer a = run_request(request, ops, puts, length, m_regions, m_records, m_pool);
  answer(from, a.reply, std::move(a.answer), a.length);
}

void OfiTransport::on_hello(const OfiHead& head, const std::byte* name, size_t name_length) {
  const MessageRequest& h = head.request;
  if (name_length == 0 || name_length > k_name_max) return;
  // The provider would map the queue the name says: only one that passes
  // the checks (ofi_shm_files.hpp). Nobody to tell otherwise.
  if (m_provider == "shm" &&
      !check_shm_queue(std::string_view(reinterpret_cast<const char*>(name),
                                        ::strnlen(reinterpret_cast<const char*>(name), name_length)))
           .ok()) {
    return;
  }
  fi_addr_t addr = FI_ADDR_NOTAVAIL;
  if (fi_av_insert(m_av, name, 1, &addr, 0, nullptr) != 1) return;
  if (m_provider == "shm") {
    std::lock_guard lock(m_origins_lock);
    watch_asker(addr, name, name_length);
  }
  if (h.admission != m_admission) {
    // Told why, and never remembered: its requests find no origin.
    refuse(addr, h, Refusal::unadmitted);
    return;
  }
  {
    std::lock_guard lock(m_origins_lock);
    // A reconnecting asker says hello again; its new address replaces the
    // old one (which stays in the address vector: operations may name it).
    if (m_origins.insert_or_assign(h.origin, addr).second) {
      m_origin_order.push_back(h.origin);
      if (m_origin_order.size() > k_origins_remembered) {
        m_origins.erase(m_origin_order.front());
        m_origin_order.pop_front();
      }
    }
  }
  MessageReply r;
  r.origin = h.origin;
  r.id = h.id;
  answer(addr, r, StagingBuffer(), 0);
}

fi_addr_t OfiTransport::origin_addr(uint64_t origin) {
  std::lock_guard lock(m_origins_lock);
  auto it = m_origins.find(origin);
  return it == m_origins.end() ? FI_ADDR_NOTAVAIL : it->second;
}

void OfiTransport::discard_payload(fi_addr_t from, uint64_t id) {
  auto landing = std::make_unique<Landing>();
  landing->discard = true;
  landing->from = from;
  landing->bytes = m_pool.take(0);
  Landing* l = landing.get();
  {
    std::lock_guard lock(m_lock);
    m_landings.emplace(l, std::move(landing));
  }
  const uint64_t tag = k_tag_payload | (id & k_id_mask);
  // Into no room: the provider drops the bytes and reports FI_ETRUNC.
  auto post = [this, l, from, tag](bool give_up) {
    std::lock_guard lock(m_lock);
    const ssize_t r = give_up ? -FI_ECANCELED
                              : fi_trecv(m_ep, l->bytes.data(), 0, nullptr, m_directed ? from : FI_ADDR_UNSPEC, tag,
                                         0, &l->ctx.fi);
    if (r == -FI_EAGAIN) return false;
    if (r != 0) m_landings.erase(l);
    return true;
  };
  if (!post(false)) post_later(post);
}

void OfiTransport::refuse(fi_addr_t to, const MessageRequest& request, Refusal refusal) {
  MessageReply r;
  r.origin = request.origin;
  r.id = request.id;
  r.refusal = refusal;
  answer(to, r, StagingBuffer(), 0);
}

void OfiTransport::answer(fi_addr_t to, const MessageReply& reply, StagingBuffer bytes, size_t length) {
  auto sending = std::make_unique<Sending>();
  sending->to = to;
  sending->reply = reply;
  sending->answer = std::move(bytes);
  Sending* s = sending.get();
  {
    std::lock_guard lock(m_lock);
    m_sendings.emplace(s, std::move(sending));
  }
  const uint64_t tag = k_tag_answer | (reply.id & k_id_mask);
  auto post = [this, s, to, tag, length](bool give_up) {
    std::lock_guard lock(m_lock);
    iovec iov[2] = {{&s->reply, sizeof s->reply}, {s->answer.data(), length}};
    const ssize_t r = give_up ? -FI_ECANCELED : fi_tsendv(m_ep, iov, nullptr, length > 0 ? 2 : 1, to, tag, &s->ctx.fi);
    if (r == -FI_EAGAIN) return false;
    if (r != 0) m_sendings.erase(s);  // nobody to answer
    return true;
  };
  if (!post(false)) post_later(post);
}

void OfiTransport::post_later(std::function<bool(bool)> post) {
  std::lock_guard lock(m_deferred_lock);
  m_deferred.push_back({std::move(post), std::chrono::steady_clock::now()});
}

bool OfiTransport::run_deferred() {
  std::deque<Deferred> pending;
  {
    std::lock_guard lock(m_deferred_lock);
    if (m_deferred.empty()) return false;
    pending.swap(m_deferred);
  }
  // Each on its own: one peer's refused post (tcp;ofi_rxm refuses every send
  // to a peer whose connection broke) holds up no other's. One refused for
  // k_post_give_up is given up (its answer dropped, its staging freed).
  const auto now = std::chrono::steady_clock::now();
  bool any = false;
  std::deque<Deferred> still;
  for (Deferred& d : pending) {
    if (d.post(now - d.since > k_post_give_up)) {
      any = true;
    } else {
      still.push_back(std::move(d));
    }
  }
  if (!still.empty()) {
    std::lock_guard lock(m_deferred_lock);
    for (auto it = still.rbegin(); it != still.rend(); ++it) m_deferred.push_front(std::move(*it));
  }
  return any;
}

void OfiTransport::sweep_landings() {
  const auto now = std::chrono::steady_clock::now();
  std::lock_guard lock(m_lock);
  for (auto& [l, landing] : m_landings) {
    if (landing->cancel_asked || now - landing->since < k_landing_timeout) continue;
    landing->cancel_asked = true;
    fi_cancel(&m_ep->fid, &landing->ctx.fi);  // its completion frees it
  }
}

void OfiTransport::watch_asker(fi_addr_t addr, const std::byte* name, size_t name_length) {
  // shm names say the pid of their process (ofi_shm_files.hpp). A name that
  // says another pid only makes its own address live as long as that pid.
  const std::string_view text(reinterpret_cast<const char*>(name), ::strnlen(reinterpret_cast<const char*>(name), name_length));
  if (!text.starts_with(k_shm_scheme)) return;
  const pid_t pid = pid_of_shm_queue(text);
  if (pid <= 0) return;
  auto [it, fresh] = m_asker_processes.try_emplace(static_cast<pid_t>(pid));
  if (fresh) {
    it->second.pidfd = static_cast<int>(::syscall(SYS_pidfd_open, static_cast<pid_t>(pid), 0));
    // Gone already (or no descriptor left): its address stays, as before.
    if (it->second.pidfd < 0) {
      m_asker_processes.erase(it);
      return;
    }
  }
  m_askers[addr] = static_cast<pid_t>(pid);
}

void OfiTransport::forget_dead_askers() {
  const auto now = std::chrono::steady_clock::now();
  bool any = false;
  {
    std::lock_guard lock(m_origins_lock);
    for (auto& [pid, p] : m_asker_processes) {
      if (p.exited == std::chrono::steady_clock::time_point{}) {
        pollfd fd{p.pidfd, POLLIN, 0};
        if (::poll(&fd, 1, 0) > 0) p.exited = now;
      } else {
        any |= now - p.exited > k_dead_asker_grace;
      }
    }
  }
  if (!any) return;
  std::lock_guard lock(m_lock);
  std::lock_guard origins(m_origins_lock);
  auto dead = [&](pid_t pid) {
    auto p = m_asker_processes.find(pid);
    return p != m_asker_processes.end() && p->second.exited != std::chrono::steady_clock::time_point{} &&
           now - p->second.exited > k_dead_asker_grace;
  };
  std::erase_if(m_askers, [&](const auto& asker) {
    const auto [addr, pid] = asker;
    if (!dead(pid)) return false;
    // An answer or a payload still naming it (shm never completes a send
    // to a dead peer's queue): kept, and its queue stays mapped.
    for (const auto& [s, owned] : m_sendings) {
      if (s->to == addr) return false;
    }
    for (const auto& [l, owned] : m_landings) {
      if (l->from == addr) return false;
    }
    fi_addr_t gone = addr;
    fi_av_remove(m_av, &gone, 1, 0);
    std::erase_if(m_origins, [&](const auto& o) { return o.second == addr; });
    return true;
  });
  std::erase_if(m_asker_processes, [&](const auto& p) {
    if (!dead(p.first)) return false;
    for (const auto& [addr, pid] : m_askers) {
      if (pid == p.first) return false;  // an address kept above
    }
    ::close(p.second.pidfd);
    return true;
  });
}

void OfiTransport::watch_exits() {
  std::vector<std::shared_ptr<OfiEndpoint>> exited;
  {
    std::lock_guard lock(m_watch_lock);
    std::erase_if(m_watched, [&](const std::weak_ptr<OfiEndpoint>& w) {
      auto ep = w.lock();
      if (ep == nullptr || ep->failed()) return true;
      if (!ep->exited()) return false;
      exited.push_back(std::move(ep));
      return true;
    });
  }
  for (const auto& ep : exited) report_failure(*ep, OfiEndpoint::k_exited);
}

void OfiTransport::progress_loop() {
  using clock = std::chrono::steady_clock;
  auto last_news = clock::now();
  auto last_sweep = last_news;
  auto last_watch = last_news;
  auto budget = m_idle_spin.budget();
  bool idle = false;
  auto nap = std::chrono::microseconds(10);
  unsigned idle_polls = 0;
  while (!m_stop.load(std::memory_order_relaxed)) {
    if (progress_once()) {
      const auto now = clock::now();
      if (idle) m_idle_spin.record(now - last_news, now - last_news, false);
      idle = false;
      last_news = now;
      nap = std::chrono::microseconds(10);
      continue;
    }
    if (!idle) {
      idle = true;
      budget = m_idle_spin.budget();
    }
    const auto now = clock::now();
    if (now - last_watch > std::chrono::milliseconds(20)) {
      watch_exits();
      last_watch = now;
    }
    if (now - last_news < budget) continue;
    if (m_cq_fd < 0 && now - last_news < k_no_fd_spin) {
      // No fd to sleep on: poll on for a while after the last request, as
      // the asking side does (a nap would add its length to a round trip).
      if (++idle_polls % 16 == 0) ::sched_yield();
      continue;
    }
    if (now - last_sweep > std::chrono::seconds(1)) {
      sweep_landings();
      if (m_provider == "shm") {
        forget_dead_askers();
        (void)sweep_dead_shm_queues_now_and_then();
      }
      last_sweep = now;
    }
    if (m_cq_fd < 0) {
      // No fd to sleep on (shm, efa, cxi): naps that grow to 1 ms while
      // nothing comes (an idle daemon wakes up to 1000 times a second).
      pollfd p{m_wake_fd, POLLIN, 0};
      const timespec t{0, static_cast<long>(std::chrono::nanoseconds(nap).count())};
      (void)::ppoll(&p, 1, &t, nullptr);
      nap = std::min(nap * 2, std::chrono::microseconds(1000));
      continue;
    }
    fid* f = &m_cq->fid;
    if (fi_trywait(m_fabric, &f, 1) != FI_SUCCESS) continue;
    // The CQ's fd (bytes on a socket, rxm's connection work) or stopping
    // wakes it; at the latest after 100 ms, for the sweep and for deferred
    // posts.
    pollfd fds[2] = {{m_cq_fd, POLLIN, 0}, {m_wake_fd, POLLIN, 0}};
    (void)::poll(fds, 2, 100);
    if ((fds[1].revents & POLLIN) != 0) {
      uint64_t n = 0;
      (void)::read(m_wake_fd, &n, sizeof n);
    }
    const auto woke = clock::now();
    m_idle_spin.record(woke - last_news, budget, true);
    idle = false;
    last_news = woke;
  }
}

}  // namespace tiermem::ofi_detail
