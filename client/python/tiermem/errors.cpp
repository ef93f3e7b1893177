// tiermem's exceptions: one class per error area, each with the library's
// code and message.
#include "py_common.hpp"

namespace tiermem::py {
namespace {

PyObject* g_error = nullptr;
// By area: ErrorCode / 100 - 1.
PyObject* g_area[5] = {};

struct AreaSpec {
  const char* name;
  const char* doc;
};
constexpr AreaSpec k_areas[5] = {
    {"RequestError",
     "A request the library refused: invalid_argument, not_found, already_exists, out_of_range, "
     "failed_precondition, not_supported, permission_denied, internal, busy."},
    {"AddressError",
     "The address space: bad_gva, not_allocated (unknown or freed), stale_generation, tier_exhausted, "
     "tier_unavailable, quota_exceeded, data_lost."},
    {"TransportError",
     "The daemon or a peer could not be reached in time: io_error, connection_failed, connection_closed (also a "
     "closed Client), timeout, transport_error, unavailable, deadline_exceeded."},
    {"ProtocolError", "The wire: protocol_mismatch, malformed_frame, frame_too_large, unexpected_message."},
    {"ConfigError", "A configuration the daemon or library could not use: config_error."},
};

}  // namespace

void bind_errors(pyb::module_& m) {
  g_error = PyErr_NewExceptionWithDoc(
      "tiermem.Error",
      "Base of tiermem's exceptions. Attributes: code (the error's name, e.g. 'not_allocated'), number (its "
      "numeric code) and message (the library's message, which says what and why).",
      PyExc_Exception, nullptr);
  m.attr("Error") = pyb::handle(g_error);
  for (int i = 0; i < 5; ++i) {
    const std::string qualified = std::string("tiermem.") + k_areas[i].name;
    g_area[i] = PyErr_NewExceptionWithDoc(qualified.c_str(), k_areas[i].doc, g_error, nullptr);
    m.attr(k_areas[i].name) = pyb::handle(g_area[i]);
  }
}

void raise(const Status& status) {
  const auto number = static_cast<uint32_t>(status.code());
  const uint32_t area = number / 100;
  PyObject* cls = area >= 1 && area <= 5 ? g_area[area - 1] : g_error;
  pyb::object instance = pyb::reinterpret_steal<pyb::object>(
      PyObject_CallFunction(cls, "s", status.to_string().c_str()));
  if (!instance) throw pyb::error_already_set();
  instance.attr("code") = std::string(error_code_name(status.code()));
  instance.attr("number") = number;
  instance.attr("message") = status.message();
  PyErr_SetObject(cls, instance.ptr());
  throw pyb::error_already_set();
}

}  // namespace tiermem::py
