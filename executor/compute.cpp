// make_compute: the CPU, or the CUDA plugin (executor/cuda/) loaded on first
// use. The plugin is looked for in $TIERMEM_EXEC_CUDA, beside the executable
// (the build tree) and in the install's plugin directory.
#include "executor/compute.hpp"

#include <dlfcn.h>
#include <unistd.h>

#include <charconv>
#include <filesystem>
#include <vector>

#include "tiermem_config.h"

namespace tiermem::exec {
namespace {

constexpr const char* k_plugin = "libtiermem-exec-cuda.so";
// The plugin's one entry point (executor/cuda/cuda_compute.cpp).
using CreateFn = Compute* (*)(int ordinal, char* error, size_t error_bytes);

std::vector<std::string> plugin_candidates() {
  std::vector<std::string> out;
  if (const char* env = std::getenv("TIERMEM_EXEC_CUDA"); env != nullptr && *env != '\0') out.emplace_back(env);
  std::error_code ec;
  const auto exe = std::filesystem::read_symlink("/proc/self/exe", ec);
  if (!ec) {
    out.push_back((exe.parent_path() / k_plugin).string());
  }
  out.push_back(std::string(TIERMEM_PLUGIN_DIR) + "/" + k_plugin);
  return out;
}

Result<std::unique_ptr<Compute>> load_cuda(int ordinal) {
  if (!TIERMEM_HAVE_CUDA_KERNELS) {
    return Status(ErrorCode::not_supported,
                  "--device cuda: this tiermem-exec was built without CUDA kernels (no nvcc under the CUDA toolkit "
                  "at build time; see the build summary)");
  }
  std::string tried;
  for (const std::string& path : plugin_candidates()) {
    if (!std::filesystem::exists(path)) {
      tried += (tried.empty() ? "" : ", ") + path;
      continue;
    }
    void* handle = ::dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (handle == nullptr) {
      return Status(ErrorCode::not_supported, "--device cuda: cannot load " + path + ": " + ::dlerror());
    }
    auto create = reinterpret_cast<CreateFn>(::dlsym(handle, "tiermem_exec_cuda_create"));
    if (create == nullptr) return Status(ErrorCode::not_supported, "--device cuda: " + path + " is not the CUDA plugin");
    char error[512] = {};
    Compute* compute = create(ordinal, error, sizeof error);
    if (compute == nullptr) return Status(ErrorCode::not_supported, std::string("--device cuda: ") + error);
    return std::unique_ptr<Compute>(compute);  // the plugin stays loaded
  }
  return Status(ErrorCode::not_supported, "--device cuda: the CUDA plugin is not installed (looked for " + tried + ")");
}

}  // namespace

Result<std::unique_ptr<Compute>> make_compute(const std::string& device) {
  if (device == "cpu") return make_cpu_compute();
  if (device == "cuda") return load_cuda(0);
  if (device.rfind("cuda:", 0) == 0) {
    int ordinal = -1;
    const char* first = device.data() + 5;
    const char* last = device.data() + device.size();
    auto [end, ec] = std::from_chars(first, last, ordinal);
    if (ec == std::errc() && end == last && first != last && ordinal >= 0) return load_cuda(ordinal);
  }
  return Status(ErrorCode::invalid_argument, "unknown device '" + device + "' (cpu, cuda or cuda:N)");
}

}  // namespace tiermem::exec
