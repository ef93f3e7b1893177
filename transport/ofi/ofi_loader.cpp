#include "transport/ofi/ofi_loader.hpp"

#include <dlfcn.h>

#include <cstdlib>

#include <mutex>
#include <string>

namespace tiermem::ofi_detail {

namespace {

OfiApi g_api{};
Status g_status;
std::once_flag g_once;
bool g_loaded = false;

template <class F>
bool resolve(void* lib, const char* name, F* out) {
  *out = reinterpret_cast<F>(::dlsym(lib, name));
  return *out != nullptr;
}

void load() {
  // tcp;ofi_rxm sizes the receive queue of its message endpoints by rx
  // attributes (2048 here) and fills a pool for it when an endpoint is
  // enabled: 200 ms of page faults and 50 MiB of memory for every
  // transport (a daemon's, each tenant plane's, each client's). 128 posted
  // receives are as fast in bench/remote.sh and cost 60 ms and 18 MiB. Set
  // before libfabric reads its parameters; an operator's own value stays.
  ::setenv("FI_OFI_RXM_MSG_RX_SIZE", "128", 0);
  // The soname the headers are of (ABI 1); RTLD_LOCAL: its providers' own
  // symbols stay out of the process's namespace.
  void* lib = ::dlopen("libfabric.so.1", RTLD_NOW | RTLD_LOCAL);
  if (lib == nullptr) {
    const char* why = ::dlerror();
    g_status = Status(ErrorCode::not_supported, std::string("libfabric is not installed here (libfabric.so.1: ") +
                                                    (why != nullptr ? why : "not found") +
                                                    "; Debian 12: libfabric1)");
    return;
  }
  const bool ok = resolve(lib, "fi_getinfo", &g_api.getinfo) && resolve(lib, "fi_freeinfo", &g_api.freeinfo) &&
                  resolve(lib, "fi_dupinfo", &g_api.dupinfo) && resolve(lib, "fi_fabric", &g_api.fabric) &&
                  resolve(lib, "fi_strerror", &g_api.strerror) && resolve(lib, "fi_version", &g_api.version);
  if (!ok) {
    g_status = Status(ErrorCode::not_supported, "libfabric.so.1 lacks a call tiermem uses (fi_getinfo, fi_freeinfo, "
                                                "fi_dupinfo, fi_fabric, fi_strerror, fi_version)");
    return;
  }
  // Never closed: providers keep threads and state until the process ends.
  g_loaded = true;
}

}  // namespace

Result<const OfiApi*> ofi_api() {
  std::call_once(g_once, load);
  if (!g_loaded) return g_status;
  return &g_api;
}

const OfiApi& api() { return g_api; }

bool ofi_loaded() {
  // Before the first ofi_api() nothing was loaded; g_loaded is written once,
  // inside call_once, which the caller's ofi_api() synchronised with.
  return g_loaded;
}

}  // namespace tiermem::ofi_detail
