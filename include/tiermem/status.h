// Status and Result: how every tiermem call that can fail reports it.
//
// No tiermem API throws. A Status is OK or carries an ErrorCode and a message
// that says what failed, on what input, and what to do about it. Result<T> holds
// either a T or a non-OK Status. Both are cheap to move and safe to copy.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <variant>

#include <tiermem/export.h>

namespace tiermem {

// Codes are grouped by area in ranges of 100, like ucs_status_t; the numeric
// values travel on the wire and appear in --json output, so never renumber.
enum class ErrorCode : uint32_t {
  ok = 0,
  // 1xx: caller errors and generic conditions
  invalid_argument = 100,
  not_found = 101,
  already_exists = 102,
  out_of_range = 103,
  failed_precondition = 104,
  not_supported = 105,
  permission_denied = 106,
  internal = 107,
  busy = 108,
  // 2xx: address space
  bad_gva = 200,
  not_allocated = 201,
  stale_generation = 202,
  tier_exhausted = 203,
  tier_unavailable = 204,
  stale_translation = 205,  // a cached translation changed underneath (retried internally)
  quota_exceeded = 206,     // the tenant's quota for the tier would be passed
  data_lost = 207,          // the bytes are gone (e.g. frames of a node whose memory was made anew)
  // 3xx: I/O and transport
  io_error = 300,
  connection_failed = 301,
  connection_closed = 302,
  timeout = 303,
  transport_error = 304,
  unavailable = 305,        // the daemon or node is down or restarting: retry later
  deadline_exceeded = 306,  // a call of a QoS class did not finish within its deadline (says what was tried)
  // 4xx: protocol
  protocol_mismatch = 400,
  malformed_frame = 401,
  frame_too_large = 402,
  unexpected_message = 403,
  // 5xx: configuration
  config_error = 500,
};

// Stable lower-case name of a code, e.g. "not_allocated".
TIERMEM_EXPORT std::string_view error_code_name(ErrorCode code);

class [[nodiscard]] TIERMEM_EXPORT Status {
 public:
  Status() = default;  // OK
  Status(ErrorCode code, std::string message)
      : m_code(code), m_message(std::move(message)) {}

  bool ok() const { return m_code == ErrorCode::ok; }
  ErrorCode code() const { return m_code; }
  const std::string& message() const { return m_message; }
  // "not_allocated: GVA 0001:... is not allocated" or "ok".
  std::string to_string() const;

  // Prefixes the message with context ("write 0001:...: ") keeping the code.
  Status with_context(std::string_view context) const;

 private:
  ErrorCode m_code = ErrorCode::ok;
  std::string m_message;
};

inline Status ok_status() { return Status(); }

namespace detail {
// Prints "tiermem: value() of an error result: <status>" to stderr and aborts.
[[noreturn]] TIERMEM_EXPORT void abort_on_error_value(const Status& status);
}  // namespace detail

// Either a value or an error.
//
// Precondition of value(), operator* and operator->: ok(). Calling them on an
// error is a bug in the caller; it stops the process with the status's
// message, in every build type (never undefined behaviour, never an
// exception).
template <typename T>
class [[nodiscard]] Result {
 public:
  Result(T value) : m_state(std::in_place_index<0>, std::move(value)) {}  // NOLINT
  // `status` must be an error; an OK one becomes internal ("Result built
  // from an OK status"), so a result never claims a value it does not have.
  Result(Status status)  // NOLINT
      : m_state(std::in_place_index<1>,
                status.ok() ? Status(ErrorCode::internal, "Result built from an OK status") : std::move(status)) {}
  Result(ErrorCode code, std::string message)
      : Result(Status(code, std::move(message))) {}

  bool ok() const { return m_state.index() == 0; }
  explicit operator bool() const { return ok(); }

  // The error, or an OK status when a value is held.
  Status status() const { return ok() ? Status() : std::get<1>(m_state); }

  T& value() & {
    check();
    return *std::get_if<0>(&m_state);
  }
  const T& value() const& {
    check();
    return *std::get_if<0>(&m_state);
  }
  T&& value() && {
    check();
    return std::move(*std::get_if<0>(&m_state));
  }
  T& operator*() & { return value(); }
  const T& operator*() const& { return value(); }
  T&& operator*() && { return std::move(*this).value(); }
  T* operator->() { return &value(); }
  const T* operator->() const { return &value(); }

  T value_or(T fallback) const& { return ok() ? value() : std::move(fallback); }

 private:
  void check() const {
    if (!ok()) detail::abort_on_error_value(*std::get_if<1>(&m_state));
  }
  std::variant<T, Status> m_state;
};

}  // namespace tiermem
