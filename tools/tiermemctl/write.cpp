// tiermemctl write GVA [FILE|-]: copies a file (or stdin) into memory at GVA.
//
// The input may not be longer than the allocation from GVA on. A regular
// file is measured first and refused before a byte is written; a stream
// (stdin, a pipe, /dev/zero) is read ahead up to that room: when it holds
// more, nothing is written and the command says so. Only a stream longer
// than k_read_ahead that turns out too long stops part-way, saying how much
// was written.
#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <vector>

#include <tiermem/units.h>

#include "tools/tiermemctl/ctl.hpp"

namespace tiermem::ctl {
namespace {

constexpr uint64_t k_read_ahead = 64 << 20;

Status too_long(const std::string& file, uint64_t room, Gva gva, uint64_t written) {
  return Status(ErrorCode::out_of_range,
                file + " holds more than the " + format_size(room) + " between " + gva.to_string() +
                    " and the end of its allocation; " +
                    (written == 0 ? std::string("nothing was written")
                                  : "the first " + format_size(written) + " were written, the rest was not"));
}

// Reads up to `n` bytes; fewer only at the end of the input.
Result<size_t> read_some(FILE* in, const std::string& file, std::vector<char>* out, size_t n) {
  out->resize(n);
  const size_t got = std::fread(out->data(), 1, n, in);
  if (std::ferror(in) != 0) return Status(ErrorCode::io_error, "reading " + file + ": " + std::strerror(errno));
  out->resize(got);
  return got;
}

}  // namespace

int cmd_write(const Context& ctx, const std::string& gva_text, const std::string& file) {
  auto gva = Gva::parse(gva_text);
  if (!gva.ok()) return fail("write", gva.status());
  FILE* in = file == "-" ? stdin : std::fopen(file.c_str(), "rb");
  if (in == nullptr) {
    return fail("write", Status(ErrorCode::invalid_argument, "cannot open " + file + ": " + std::strerror(errno)));
  }
  struct Closer {
    FILE* f;
    ~Closer() {
      if (f != stdin) std::fclose(f);
    }
  } closer{in};
  auto client = connect(ctx);
  if (!client) return k_exit_failed;
  auto room = room_at(*client, *gva);
  if (!room.ok()) return fail("write " + gva_text, room.status());
  struct stat st {};
  if (::fstat(::fileno(in), &st) == 0 && S_ISREG(st.st_mode) && static_cast<uint64_t>(st.st_size) > *room) {
    return fail("write " + gva_text, too_long(file, *room, *gva, 0));
  }
  // Read ahead up to the room (one byte more shows whether there is more),
  // at most k_read_ahead; then on in chunks, each checked before it is
  // written.
  std::vector<char> data;
  uint64_t want = std::min<uint64_t>(*room, k_read_ahead) + 1;
  uint64_t written = 0;
  for (;;) {
    auto got = read_some(in, file, &data, want);
    if (!got.ok()) return fail("write", got.status());
    if (written + *got > *room) return fail("write " + gva_text, too_long(file, *room, *gva, written));
    for (size_t off = 0; off < data.size(); off += k_chunk_bytes) {
      const size_t piece = std::min<size_t>(k_chunk_bytes, data.size() - off);
      Status s = client->write(gva->plus(written + off), data.data() + off, piece);
      if (!s.ok()) return fail("write " + gva_text + " at offset " + std::to_string(written + off), s);
    }
    written += *got;
    if (*got < want) break;  // the input ended
    want = std::min<uint64_t>(k_chunk_bytes, *room - written) + 1;
  }
  if (ctx.json) {
    print_json({{"gva", gva->to_string()}, {"bytes", written}});
  } else {
    std::printf("wrote %llu bytes to %s\n", static_cast<unsigned long long>(written), gva->to_string().c_str());
  }
  return k_exit_ok;
}

}  // namespace tiermem::ctl
