// Which fabric a transport is made on: the daemon's [transport] fabric, or
// for a client the address of the peer it reaches (transport.hpp).
#include "transport/transport.hpp"

namespace tiermem {

namespace {
// The first word of a libfabric transport's address (ofi/ofi_address.cpp
// writes the rest: provider, admission token, process, endpoint name).
constexpr std::string_view k_ofi_prefix = "tmofi1 ";
}  // namespace

bool is_ofi_address(std::string_view address) { return address.starts_with(k_ofi_prefix); }

std::string ofi_provider_of(std::string_view address) {
  if (!is_ofi_address(address)) return "";
  address.remove_prefix(k_ofi_prefix.size());
  return std::string(address.substr(0, address.find(' ')));
}

Result<std::unique_ptr<Transport>> make_transport(const FabricChoice& choice, const UcxOptions& ucx) {
  if (choice.fabric == "ucx") return make_ucx_transport(ucx);
  if (choice.fabric != "libfabric") {
    return Status(ErrorCode::invalid_argument, "unknown fabric '" + choice.fabric + "' (ucx or libfabric)");
  }
  OfiOptions o;
  o.provider = choice.provider;
  o.progress_thread = ucx.progress_thread;
  o.spin_us = ucx.spin_us;
  o.listen_ip = ucx.listen_ip;
  return make_ofi_transport(o);
}

Result<std::unique_ptr<Transport>> make_transport_for(std::string_view address, const UcxOptions& ucx) {
  if (!is_ofi_address(address)) return make_ucx_transport(ucx);
  return make_transport({.fabric = "libfabric", .provider = ofi_provider_of(address)}, ucx);
}

}  // namespace tiermem
