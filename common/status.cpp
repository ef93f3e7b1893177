#include <cstdio>
#include <cstdlib>
#include <string>

#include <tiermem/status.h>

namespace tiermem {

std::string_view error_code_name(ErrorCode code) {
  switch (code) {
    case ErrorCode::ok: return "ok";
    case ErrorCode::invalid_argument: return "invalid_argument";
    case ErrorCode::not_found: return "not_found";
    case ErrorCode::already_exists: return "already_exists";
    case ErrorCode::out_of_range: return "out_of_range";
    case ErrorCode::failed_precondition: return "failed_precondition";
    case ErrorCode::not_supported: return "not_supported";
    case ErrorCode::permission_denied: return "permission_denied";
    case ErrorCode::internal: return "internal";
    case ErrorCode::busy: return "busy";
    case ErrorCode::bad_gva: return "bad_gva";
    case ErrorCode::not_allocated: return "not_allocated";
    case ErrorCode::stale_generation: return "stale_generation";
    case ErrorCode::tier_exhausted: return "tier_exhausted";
    case ErrorCode::tier_unavailable: return "tier_unavailable";
    case ErrorCode::stale_translation: return "stale_translation";
    case ErrorCode::quota_exceeded: return "quota_exceeded";
    case ErrorCode::data_lost: return "data_lost";
    case ErrorCode::io_error: return "io_error";
    case ErrorCode::connection_failed: return "connection_failed";
    case ErrorCode::connection_closed: return "connection_closed";
    case ErrorCode::timeout: return "timeout";
    case ErrorCode::transport_error: return "transport_error";
    case ErrorCode::unavailable: return "unavailable";
    case ErrorCode::deadline_exceeded: return "deadline_exceeded";
    case ErrorCode::protocol_mismatch: return "protocol_mismatch";
    case ErrorCode::malformed_frame: return "malformed_frame";
    case ErrorCode::frame_too_large: return "frame_too_large";
    case ErrorCode::unexpected_message: return "unexpected_message";
    case ErrorCode::config_error: return "config_error";
  }
  return "unknown_error";
}

std::string Status::to_string() const {
  if (ok()) return "ok";
  std::string out(error_code_name(m_code));
  out += ": ";
  out += m_message;
  return out;
}

Status Status::with_context(std::string_view context) const {
  if (ok()) return *this;
  std::string msg(context);
  msg += ": ";
  msg += m_message;
  return Status(m_code, std::move(msg));
}

namespace detail {

void abort_on_error_value(const Status& status) {
  std::fprintf(stderr, "tiermem: value() of an error result: %s\n", status.to_string().c_str());
  std::fflush(stderr);
  std::abort();
}

}  // namespace detail

}  // namespace tiermem
