// Length-prefixed frames on a stream socket, with optional file descriptors.
//
// A frame is a 4-byte little-endian payload length followed by the payload.
// Descriptors travel as SCM_RIGHTS on the first byte of the frame. These
// helpers block; the daemon uses its own asynchronous reader (Asio) but the
// same header layout (encode_frame_header / decode_frame_header).
#pragma once

#include <array>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include <tiermem/status.h>

#include "common/unique_fd.hpp"

namespace tiermem::wire {

inline constexpr size_t k_frame_header_bytes = 4;
// Descriptors one frame carries at most (the kernel's limit is 253).
inline constexpr size_t k_max_fds_per_frame = 64;

std::array<unsigned char, k_frame_header_bytes> encode_frame_header(uint32_t length);
uint32_t decode_frame_header(const unsigned char* header);

// Writes one frame. Errors: connection_closed (peer gone), io_error.
Status send_frame(int sock, std::string_view payload, std::span<const int> fds = {});
// Writes one frame built in place: the first k_frame_header_bytes of `frame`
// are room for the header (filled here), the rest is the payload, which is
// not copied again. Errors: those of send_frame.
Status send_framed(int sock, std::string& frame);

// Sends raw bytes with `fds` attached to the first one (used for the frame
// header by the daemon too). Returns the number of bytes sent by the first
// sendmsg (at least 1) or an error; busy when a non-blocking socket is full.
Result<size_t> send_with_fds(int sock, const void* data, size_t length, std::span<const int> fds);

// Reads one frame. A length above max_payload is frame_too_large (the stream
// is then unusable). Descriptors that arrive are appended to *fds.
// Errors: connection_closed, frame_too_large, io_error.
Status recv_frame(int sock, uint32_t max_payload, std::string* payload, std::vector<UniqueFd>* fds);

}  // namespace tiermem::wire
