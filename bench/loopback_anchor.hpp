// The physical anchor of the remote benchmarks over TCP: a request/reply over
// a plain TCP loopback connection in this process, a thread answering with
// blocking sockets (TCP_NODELAY on both ends). What the kernel's TCP gives one
// call at a time on this host, measured in the same run as our figures.
//
// A "write-like" exchange sends `size` bytes and gets 8 back; a "read-like"
// one sends 8 and gets `size` back; an 8-byte exchange is both.
#pragma once

#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include <cstdint>
#include <thread>
#include <vector>

#include "bench/bench_util.hpp"

namespace tiermem::bench {

class LoopbackAnchor {
 public:
  LoopbackAnchor() {
    const int listener = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof a;
    if (listener < 0 || ::bind(listener, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0 ||
        ::listen(listener, 1) != 0 || ::getsockname(listener, reinterpret_cast<sockaddr*>(&a), &len) != 0) {
      return;
    }
    m_server = std::thread([this, listener] {
      const int s = ::accept(listener, nullptr, nullptr);
      ::close(listener);
      if (s >= 0) serve(s);
    });
    m_client = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (::connect(m_client, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) {
      ::close(m_client);
      m_client = -1;
    }
    no_delay(m_client);
  }
  ~LoopbackAnchor() {
    if (m_client >= 0) ::close(m_client);  // the server sees EOF and ends
    if (m_server.joinable()) m_server.join();
  }
  bool ok() const { return m_client >= 0; }

  // Seconds of one exchange of `out` bytes out and `back` bytes back: the
  // request (a 16-byte header and its bytes) goes in one sendmsg.
  double exchange(std::vector<char>& buffer, uint64_t out, uint64_t back) {
    const double start = now_seconds();
    uint64_t header[2] = {out, back};
    if (!send_all(m_client, header, buffer.data(), out) || !full(m_client, buffer.data(), back, true)) return -1;
    return now_seconds() - start;
  }

 private:
  static void no_delay(int s) {
    const int one = 1;
    (void)::setsockopt(s, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  }
  static bool full(int s, void* p, size_t n, bool receive) {
    auto* c = static_cast<char*>(p);
    while (n > 0) {
      const ssize_t r = receive ? ::recv(s, c, n, 0) : ::send(s, c, n, MSG_NOSIGNAL);
      if (r <= 0) return false;
      c += r;
      n -= static_cast<size_t>(r);
    }
    return true;
  }
  static bool send_all(int s, uint64_t (&header)[2], char* data, size_t n) {
    iovec v[2] = {{header, sizeof header}, {data, n}};
    msghdr m{};
    m.msg_iov = v;
    m.msg_iovlen = 2;
    size_t left = sizeof header + n;
    while (left > 0) {
      const ssize_t r = ::sendmsg(s, &m, MSG_NOSIGNAL);
      if (r <= 0) return false;
      left -= static_cast<size_t>(r);
      // Skip what went.
      size_t done = static_cast<size_t>(r);
      while (m.msg_iovlen > 0 && done >= m.msg_iov[0].iov_len) {
        done -= m.msg_iov[0].iov_len;
        ++m.msg_iov;
        --m.msg_iovlen;
      }
      if (m.msg_iovlen > 0) {
        m.msg_iov[0].iov_base = static_cast<char*>(m.msg_iov[0].iov_base) + done;
        m.msg_iov[0].iov_len -= done;
      }
    }
    return true;
  }
  static void serve(int s) {
    no_delay(s);
    std::vector<char> buffer(64 << 20);
    for (;;) {
      uint64_t header[2];
      if (!full(s, header, sizeof header, true) || header[0] > buffer.size() || header[1] > buffer.size()) break;
      if (!full(s, buffer.data(), header[0], true) || !full(s, buffer.data(), header[1], false)) break;
    }
    ::close(s);
  }

  int m_client = -1;
  std::thread m_server;
};

}  // namespace tiermem::bench
