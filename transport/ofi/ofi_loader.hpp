// libfabric, loaded when the first libfabric transport is made (dlopen), not
// linked: Debian's libfabric.so.1 pulls in libpsm2 and libpsm_infinipath,
// whose set-up at load time took about 200 ms in every process here, UCX
// clients included (tests/integration: two hundred clients killed before
// their hello all died in it). Only the calls libfabric exports are needed
// through here; the rest of its API is inline, through the objects' ops
// tables.
#pragma once

#include <rdma/fabric.h>

#include <cstdint>

#include <tiermem/status.h>

namespace tiermem::ofi_detail {

struct OfiApi {
  int (*getinfo)(uint32_t version, const char* node, const char* service, uint64_t flags, const fi_info* hints,
                 fi_info** info);
  void (*freeinfo)(fi_info* info);
  fi_info* (*dupinfo)(const fi_info* info);
  int (*fabric)(fi_fabric_attr* attr, fid_fabric** fabric, void* context);
  const char* (*strerror)(int errnum);
  uint32_t (*version)();
  fi_info* allocinfo() const { return dupinfo(nullptr); }
};

// libfabric's exported calls, loaded on first use (thread-safe). Errors:
// not_supported (libfabric.so.1 is not installed, or lacks a call).
Result<const OfiApi*> ofi_api();
// The loaded API; only after ofi_api() succeeded.
const OfiApi& api();
// Whether libfabric was loaded in this process.
bool ofi_loaded();

}  // namespace tiermem::ofi_detail
