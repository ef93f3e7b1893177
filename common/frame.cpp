#include "common/frame.hpp"

#include <sys/socket.h>
#include <sys/uio.h>

#include <cerrno>
#include <cstring>

#include <tiermem/status_macros.h>

namespace tiermem::wire {
namespace {

Status errno_status(const char* what) {
  const int err = errno;
  if (err == EPIPE || err == ECONNRESET) {
    return Status(ErrorCode::connection_closed, std::string(what) + ": peer closed the connection");
  }
  if (err == EAGAIN || err == EWOULDBLOCK) {
    return Status(ErrorCode::timeout, std::string(what) + ": no answer in time");
  }
  return Status(ErrorCode::io_error, std::string(what) + ": " + std::strerror(err));
}

// Appends descriptors carried by `msg` to *fds.
void collect_fds(msghdr* msg, std::vector<UniqueFd>* fds) {
  for (cmsghdr* c = CMSG_FIRSTHDR(msg); c != nullptr; c = CMSG_NXTHDR(msg, c)) {
    if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS) continue;
    const size_t n = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
    const auto* data = reinterpret_cast<const int*>(CMSG_DATA(c));
    for (size_t i = 0; i < n; ++i) {
      int fd;
      std::memcpy(&fd, data + i, sizeof fd);
      fds->emplace_back(fd);
    }
  }
}

// Reads exactly `length` bytes, collecting any descriptors on the way.
Status recv_exact(int sock, void* out, size_t length, std::vector<UniqueFd>* fds) {
  auto* p = static_cast<char*>(out);
  while (length > 0) {
    alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int) * k_max_fds_per_frame)];
    iovec iov{p, length};
    msghdr msg{};
    msg.msg_iov = &iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control;
    msg.msg_controllen = sizeof control;
    const ssize_t n = ::recvmsg(sock, &msg, MSG_CMSG_CLOEXEC);
    if (n < 0) {
      if (errno == EINTR) continue;
      return errno_status("receive");
    }
    if (fds != nullptr) collect_fds(&msg, fds);
    if (n == 0) return Status(ErrorCode::connection_closed, "peer closed the connection");
    p += n;
    length -= static_cast<size_t>(n);
  }
  return Status();
}

Status send_all(int sock, const char* p, size_t length) {
  while (length > 0) {
    const ssize_t n = ::send(sock, p, length, MSG_NOSIGNAL);
    if (n < 0) {
      if (errno == EINTR) continue;
      return errno_status("send");
    }
    p += n;
    length -= static_cast<size_t>(n);
  }
  return Status();
}

}  // namespace

std::array<unsigned char, k_frame_header_bytes> encode_frame_header(uint32_t length) {
  return {static_cast<unsigned char>(length), static_cast<unsigned char>(length >> 8),
          static_cast<unsigned char>(length >> 16), static_cast<unsigned char>(length >> 24)};
}

uint32_t decode_frame_header(const unsigned char* h) {
  return static_cast<uint32_t>(h[0]) | static_cast<uint32_t>(h[1]) << 8 |
         static_cast<uint32_t>(h[2]) << 16 | static_cast<uint32_t>(h[3]) << 24;
}

Result<size_t> send_with_fds(int sock, const void* data, size_t length, std::span<const int> fds) {
  if (fds.size() > k_max_fds_per_frame) {
    return Status(ErrorCode::internal, "too many descriptors for one frame");
  }
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int) * k_max_fds_per_frame)] = {};
  iovec iov{const_cast<void*>(data), length};
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  if (!fds.empty()) {
    msg.msg_control = control;
    msg.msg_controllen = CMSG_SPACE(sizeof(int) * fds.size());
    cmsghdr* c = CMSG_FIRSTHDR(&msg);
    c->cmsg_level = SOL_SOCKET;
    c->cmsg_type = SCM_RIGHTS;
    c->cmsg_len = CMSG_LEN(sizeof(int) * fds.size());
    std::memcpy(CMSG_DATA(c), fds.data(), sizeof(int) * fds.size());
  }
  for (;;) {
    const ssize_t n = ::sendmsg(sock, &msg, MSG_NOSIGNAL);
    if (n >= 0) return static_cast<size_t>(n);
    if (errno == EAGAIN || errno == EWOULDBLOCK) {
      return Status(ErrorCode::busy, "socket send buffer full");
    }
    if (errno != EINTR) return errno_status("send");
  }
}

Status send_frame(int sock, std::string_view payload, std::span<const int> fds) {
  const auto header = encode_frame_header(static_cast<uint32_t>(payload.size()));
  std::string buf(reinterpret_cast<const char*>(header.data()), header.size());
  buf.append(payload);
  TIERMEM_ASSIGN_OR_RETURN(auto sent, send_with_fds(sock, buf.data(), buf.size(), fds));
  return send_all(sock, buf.data() + sent, buf.size() - sent);
}

Status send_framed(int sock, std::string& frame) {
  const auto header = encode_frame_header(static_cast<uint32_t>(frame.size() - k_frame_header_bytes));
  std::memcpy(frame.data(), header.data(), header.size());
  return send_all(sock, frame.data(), frame.size());
}

Status recv_frame(int sock, uint32_t max_payload, std::string* payload, std::vector<UniqueFd>* fds) {
  unsigned char header[k_frame_header_bytes];
  Status s = recv_exact(sock, header, sizeof header, fds);
  if (!s.ok()) return s;
  const uint32_t length = decode_frame_header(header);
  if (length > max_payload) {
    return Status(ErrorCode::frame_too_large, "frame of " + std::to_string(length) +
                                                  " bytes exceeds the limit of " +
                                                  std::to_string(max_payload));
  }
  payload->resize(length);
  return recv_exact(sock, payload->data(), length, fds);
}

}  // namespace tiermem::wire
