// The asking side of the message path that every fabric shares: a batch's
// operations collected into one message per endpoint (a new one when the
// open one is full), sent in issue order. A fabric's batch derives from
// MessageBatch with its own message type (which has `ep`, `waiter`, `ops`,
// `dst`, `result`, `put_bytes`, `get_bytes`) and says how a message is sent.
#pragma once

#include <cstddef>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include <tiermem/status.h>

#include "transport/message_sequence.hpp"
#include "transport/transport.hpp"
#include "transport/wait_policy.hpp"

namespace tiermem::transport_detail {

// Whether one operation fits in a message at all.
inline Status check_op_size(const sequence::Op& op) {
  if (op.length > sequence::k_max_bytes && (op.kind == sequence::OpKind::get || op.kind == sequence::OpKind::put)) {
    return Status(ErrorCode::invalid_argument, "a get or put of " + std::to_string(op.length) +
                                                   " bytes; one message carries at most " +
                                                   std::to_string(sequence::k_max_bytes) + " (split it)");
  }
  return Status();
}

template <class Message, class Ep>
class MessageBatch : public TransportBatch {
 public:
  // Messages in issue order: sent ones, and per endpoint the one still open
  // (collecting operations until it is sent).
  std::vector<std::unique_ptr<Message>> m_messages;
  std::vector<bool> m_is_done;
  std::unordered_map<Ep*, Message*> m_open;
  size_t m_done = 0;          // how many are done
  bool m_retry_soon = false;  // a message refused `busy` waits to be sent again

  // Operations of unfinished messages.
  size_t pending_messages() const {
    size_t n = 0;
    for (size_t i = 0; i < m_messages.size(); ++i) {
      if (!m_is_done[i]) n += std::max<size_t>(1, m_messages[i]->ops.size());
    }
    return n;
  }

  void clear_messages() {
    m_messages.clear();
    m_is_done.clear();
    m_open.clear();
    m_done = 0;
    m_retry_soon = false;
  }

  // The open message of `ep` with room for an operation of `put`/`get`
  // bytes: a new one when the open one is full (which `send` sends now).
  template <class Send>
  Message& open_message(Ep& ep, size_t put, size_t get, Send&& send) {
    auto it = m_open.find(&ep);
    if (it != m_open.end()) {
      Message& m = *it->second;
      if (m.ops.size() < sequence::k_max_ops && m.put_bytes + put <= sequence::k_max_bytes &&
          m.get_bytes + get <= sequence::k_max_bytes) {
        return m;
      }
      send(m);
      m_open.erase(it);
    }
    auto m = std::make_unique<Message>();
    m->ep = &ep;
    m->waiter = &Waiter::of_this_thread();
    Message& ref = *m;
    m_messages.push_back(std::move(m));
    m_is_done.push_back(false);
    m_open.emplace(&ep, &ref);
    return ref;
  }

  // Adds `op` to the open message of `ep`; the fabric keeps `src` itself.
  template <class Send>
  Result<Message*> add_op(Ep& ep, const sequence::Op& op, void* dst, uint64_t* result, Send&& send) {
    if (Status s = check_op_size(op); !s.ok()) return s;
    const size_t put = op.kind == sequence::OpKind::put ? op.length : 0;
    const size_t get = op.kind == sequence::OpKind::get ? op.length : 0;
    Message& m = open_message(ep, put, get, send);
    m.ops.push_back(op);
    m.dst.push_back(dst);
    m.result.push_back(result);
    m.put_bytes += put;
    m.get_bytes += get;
    return &m;
  }

  // Transport::reserve.
  template <class Send>
  Status reserve(Ep& ep, size_t ops, size_t put_bytes, size_t get_bytes, Send&& send) {
    if (ops > sequence::k_max_ops || put_bytes > sequence::k_max_bytes || get_bytes > sequence::k_max_bytes) {
      return Status(ErrorCode::invalid_argument, std::to_string(ops) + " operations of " + std::to_string(put_bytes) +
                                                     " + " + std::to_string(get_bytes) +
                                                     " bytes do not fit in one message");
    }
    auto it = m_open.find(&ep);
    if (it == m_open.end()) return Status();
    const Message& m = *it->second;
    if (m.ops.size() + ops <= sequence::k_max_ops && m.put_bytes + put_bytes <= sequence::k_max_bytes &&
        m.get_bytes + get_bytes <= sequence::k_max_bytes) {
      return Status();
    }
    send(*it->second);
    m_open.erase(it);
    return Status();
  }

  // Sends every open message, in issue order (so the first to one endpoint
  // goes first).
  template <class Send>
  void send_open(Send&& send) {
    for (size_t i = 0; i < m_messages.size() && !m_open.empty(); ++i) {
      Message& m = *m_messages[i];
      auto it = m_open.find(m.ep);
      if (it == m_open.end() || it->second != &m) continue;
      send(m);
      m_open.erase(it);
    }
  }
};

}  // namespace tiermem::transport_detail
