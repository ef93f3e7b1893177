// A build without libfabric (-Dlibfabric=disabled, or libfabric-dev missing):
// its transport is refused at run time with the reason.
#include "transport/transport.hpp"

namespace tiermem {

Result<std::unique_ptr<Transport>> make_ofi_transport(const OfiOptions& options) {
  return Status(ErrorCode::not_supported, "fabric libfabric (provider " + options.provider +
                                              "): this build has no libfabric transport (-Dlibfabric; Debian 12: "
                                              "libfabric-dev)");
}

std::string libfabric_version() { return ""; }

}  // namespace tiermem
