// tiermemctl write GVA [FILE|-]: copies a file (or stdin) into memory at GVA.
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <vector>

#include "tools/tiermemctl/ctl.hpp"

namespace tiermem::ctl {
namespace {

Result<std::vector<char>> slurp(const std::string& file) {
  FILE* in = file == "-" ? stdin : std::fopen(file.c_str(), "rb");
  if (in == nullptr) {
    return Status(ErrorCode::invalid_argument, "cannot open " + file + ": " + std::strerror(errno));
  }
  std::vector<char> data;
  char buf[1 << 16];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof buf, in)) > 0) data.insert(data.end(), buf, buf + n);
  const bool error = std::ferror(in) != 0;
  if (in != stdin) std::fclose(in);
  if (error) return Status(ErrorCode::io_error, "reading " + file + " failed");
  return data;
}

}  // namespace

int cmd_write(const Context& ctx, const std::string& gva_text, const std::string& file) {
  auto gva = Gva::parse(gva_text);
  if (!gva.ok()) return fail("write", gva.status());
  auto data = slurp(file);
  if (!data.ok()) return fail("write", data.status());
  auto client = connect(ctx);
  if (!client) return k_exit_failed;
  Status s = client->write(*gva, data->data(), data->size());
  if (!s.ok()) return fail("write " + gva_text, s);
  if (ctx.json) {
    print_json({{"gva", gva->to_string()}, {"bytes", data->size()}});
  } else {
    std::printf("wrote %zu bytes to %s\n", data->size(), gva->to_string().c_str());
  }
  return k_exit_ok;
}

}  // namespace tiermem::ctl
