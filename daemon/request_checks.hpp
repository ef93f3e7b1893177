// Checks of what arrives on a control connection, before anything else looks
// at it: the frame's declared length (limit_for), its decoding
// (parse_request), and of a decoded request, every enum holds one of its values
// (proto3 enums keep unknown numbers: tier 99 used to be taken as auto, atomic
// op 7 as compare-swap) and every node id fits in 16 bits (65537 used to be
// node 1). Done by reflection over the whole message, so a field added later
// is checked too.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include <tiermem/status.h>

namespace google::protobuf {
class Message;
}

namespace tiermem {

namespace proto {
class Request;
}

// Frames before a session said who it is are at most this long: a hello, a
// peer's challenge and hello (its NodeInfo with a key per region).
inline constexpr uint32_t k_greeting_frame_bytes = 256 << 10;

// Whether a frame that declares `length` bytes may be read. Errors:
// frame_too_large, saying which limit.
Status check_frame_length(uint64_t length, bool greeted, uint64_t max_frame_bytes);
// Decodes a frame's body. Errors: malformed_frame.
Status parse_request(std::string_view body, proto::Request* out);

// Errors: invalid_argument naming the field ("alloc.tier") and the value.
Status check_request_fields(const google::protobuf::Message& request);

}  // namespace tiermem
