// A structured mutation fuzzer of the frame decoder and request handler
// (fuzz/request_target.hpp), for any compiler: no coverage feedback, but
// inputs made to reach deep: each is one session of requests built from the
// protocol's own descriptors (every request type, every field, through
// reflection), filled with values at the edges (0, -1, page and frame
// boundaries, 2^32, 2^63, enums out of range) and with GVAs, frame offsets
// and names the target handed out earlier, then serialized as frames and,
// one time in four, mangled as bytes (flips, cuts, splices, wrong lengths).
//
//   structured_fuzz [--seconds S] [--execs N] [--seed X] [--write-corpus DIR COUNT]
//   structured_fuzz --replay FILE...
//
// --replay runs each saved input (a crash, a hang, fuzz/regressions/*) once
// through a fresh target, in this process: a debugger sees the fault where
// it happens.
//
// Prints progress every 5 s and, at the end, `name value` lines: execs,
// execs_per_s, requests, ok_responses, crashes, hangs, slowest_ms. The
// fuzzing runs in a child process, so that a crash is seen and counted by
// the parent (the child's signal handler saves the input to fuzz-crash.bin
// first). An input that takes over 2 s is a hang: saved to
// fuzz-hang-<n>.bin. Exit status 1 on any crash or hang.
#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <google/protobuf/descriptor.h>
#include <google/protobuf/message.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iterator>
#include <random>
#include <string>
#include <vector>

#include "common/frame.hpp"
#include "control.pb.h"
#include "fuzz/request_target.hpp"

namespace tiermem::fuzz {
namespace {

using google::protobuf::FieldDescriptor;
using google::protobuf::Message;
using Clock = std::chrono::steady_clock;

// What the target handed out, to aim later requests at.
struct Knowledge {
  std::vector<proto::Gva> gvas;
  std::vector<uint64_t> frame_offsets;
  std::vector<std::string> names;
  void learn(const proto::Response& r) {
    if (r.has_alloc()) {
      gvas.push_back(r.alloc().allocation().gva());
      if (!r.alloc().allocation().name().empty()) names.push_back(r.alloc().allocation().name());
    }
    if (r.has_translate()) {
      for (const auto& x : r.translate().extents()) frame_offsets.push_back(x.frame_offset());
    }
    if (gvas.size() > 64) gvas.erase(gvas.begin());
    if (frame_offsets.size() > 64) frame_offsets.erase(frame_offsets.begin());
    if (names.size() > 16) names.erase(names.begin());
  }
};

// xoshiro256**: random enough for choosing mutations, and cheap (the
// generator was most of the fuzzer's time with std::mt19937_64).
class Rng {
 public:
  explicit Rng(uint64_t seed) {
    for (uint64_t& s : m_s) {  // splitmix64
      seed += 0x9e3779b97f4a7c15;
      uint64_t z = seed;
      z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9;
      z = (z ^ (z >> 27)) * 0x94d049bb133111eb;
      s = z ^ (z >> 31);
    }
  }
  uint64_t operator()() {
    const uint64_t result = rotl(m_s[1] * 5, 7) * 9;
    const uint64_t t = m_s[1] << 17;
    m_s[2] ^= m_s[0];
    m_s[3] ^= m_s[1];
    m_s[1] ^= m_s[2];
    m_s[0] ^= m_s[3];
    m_s[2] ^= t;
    m_s[3] = rotl(m_s[3], 45);
    return result;
  }

 private:
  static uint64_t rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }
  uint64_t m_s[4];
};

class Mutator {
 public:
  explicit Mutator(uint64_t seed) : m_rng(seed) {}

  uint64_t below(uint64_t n) { return n == 0 ? 0 : m_rng() % n; }
  bool one_in(uint64_t n) { return below(n) == 0; }

  uint64_t interesting(const Knowledge& k) {
    static const uint64_t k_values[] = {0,          1,          2,          7,           8,
                                        63,         64,         4095,       4096,        4097,
                                        65535,      65536,      65537,      1 << 20,     (1 << 20) + 1,
                                        2 << 20,    0x7fffffff, 0x80000000, 0xffffffff,  1ull << 32,
                                        1ull << 40, 1ull << 62, 1ull << 63, ~0ull,       ~0ull - 1};
    switch (below(6)) {
      case 0: return m_rng();
      case 1: return below(16);
      case 2:
        if (!k.gvas.empty()) return k.gvas[below(k.gvas.size())].offset() + below(8192) - 4096;
        [[fallthrough]];
      case 3:
        if (!k.frame_offsets.empty()) return k.frame_offsets[below(k.frame_offsets.size())] + below(3) * 4096;
        [[fallthrough]];
      default: return k_values[below(std::size(k_values))];
    }
  }

  std::string text(const Knowledge& k) {
    if (!k.names.empty() && one_in(2)) return k.names[below(k.names.size())];
    std::string s(below(one_in(16) ? 300 : 12), 'a');
    for (char& c : s) c = static_cast<char>('!' + below(94));
    return s;
  }
  std::string bytes() {
    std::string s(one_in(8) ? below(70000) : below(64), '\0');
    for (size_t i = 0; i < s.size(); i += 8) {
      const uint64_t v = m_rng();
      std::memcpy(s.data() + i, &v, std::min<size_t>(8, s.size() - i));
    }
    return s;
  }

  // Sets (or adds to) one field of `m` to a value at the edges.
  void mutate_field(Message* m, const FieldDescriptor* f, const Knowledge& k, int depth) {
    const auto* r = m->GetReflection();
    const bool rep = f->is_repeated();
    if (rep && r->FieldSize(*m, f) > 0 && one_in(3)) {
      r->RemoveLast(m, f);
      return;
    }
    switch (f->cpp_type()) {
      case FieldDescriptor::CPPTYPE_INT32: {
        const auto v = static_cast<int32_t>(interesting(k));
        rep ? r->AddInt32(m, f, v) : r->SetInt32(m, f, v);
        break;
      }
      case FieldDescriptor::CPPTYPE_INT64: {
        const auto v = static_cast<int64_t>(interesting(k));
        rep ? r->AddInt64(m, f, v) : r->SetInt64(m, f, v);
        break;
      }
      case FieldDescriptor::CPPTYPE_UINT32: {
        const auto v = static_cast<uint32_t>(one_in(2) ? below(4) : interesting(k));
        rep ? r->AddUInt32(m, f, v) : r->SetUInt32(m, f, v);
        break;
      }
      case FieldDescriptor::CPPTYPE_UINT64: {
        const uint64_t v = interesting(k);
        rep ? r->AddUInt64(m, f, v) : r->SetUInt64(m, f, v);
        break;
      }
      case FieldDescriptor::CPPTYPE_BOOL: {
        const bool v = one_in(2);
        rep ? r->AddBool(m, f, v) : r->SetBool(m, f, v);
        break;
      }
      case FieldDescriptor::CPPTYPE_ENUM: {
        const int count = f->enum_type()->value_count();
        const int v = one_in(5) ? static_cast<int>(below(200)) - 50
                                : f->enum_type()->value(static_cast<int>(below(count)))->number();
        rep ? r->AddEnumValue(m, f, v) : r->SetEnumValue(m, f, v);
        break;
      }
      case FieldDescriptor::CPPTYPE_STRING: {
        const std::string v = f->type() == FieldDescriptor::TYPE_BYTES ? bytes() : text(k);
        rep ? r->AddString(m, f, v) : r->SetString(m, f, v);
        break;
      }
      case FieldDescriptor::CPPTYPE_MESSAGE: {
        if (depth > 4) break;
        Message* sub = rep ? r->AddMessage(m, f) : r->MutableMessage(m, f);
        fill(sub, k, depth + 1, 1 + below(3));
        break;
      }
      default:
        break;
    }
  }

  // Sets `count` random fields of `m`, then aims its GVAs at known memory.
  void fill(Message* m, const Knowledge& k, int depth, uint64_t count) {
    const auto* d = m->GetDescriptor();
    if (d->field_count() == 0) return;
    for (uint64_t i = 0; i < count; ++i) mutate_field(m, d->field(static_cast<int>(below(d->field_count()))), k, depth);
    aim(m, k, depth);
  }

  // Every Gva in `m`: most of the time one the target handed out (its
  // generation right, or not).
  void aim(Message* m, const Knowledge& k, int depth) {
    if (depth > 5) return;
    if (auto* g = dynamic_cast<proto::Gva*>(m); g != nullptr && !k.gvas.empty() && !one_in(4)) {
      *g = k.gvas[below(k.gvas.size())];
      if (one_in(4)) g->set_offset(g->offset() + below(3) * 4096 + (one_in(2) ? 0 : below(4096)));
      if (one_in(8)) g->set_generation(g->generation() + 1);
      return;
    }
    const auto* r = m->GetReflection();
    std::vector<const FieldDescriptor*> fields;
    r->ListFields(*m, &fields);
    for (const FieldDescriptor* f : fields) {
      if (f->cpp_type() != FieldDescriptor::CPPTYPE_MESSAGE) continue;
      if (f->is_repeated()) {
        for (int i = 0; i < r->FieldSize(*m, f); ++i) aim(r->MutableRepeatedMessage(m, f, i), k, depth + 1);
      } else {
        aim(r->MutableMessage(m, f), k, depth + 1);
      }
    }
  }

  // A request of a random type, its body filled at the edges.
  proto::Request request(const Knowledge& k) {
    proto::Request q;
    const auto* body = proto::Request::descriptor()->FindOneofByName("body");
    const FieldDescriptor* f = body->field(static_cast<int>(below(body->field_count())));
    Message* m = q.GetReflection()->MutableMessage(&q, f);
    fill(m, k, 1, below(4));
    if (one_in(6)) fill(&q, k, 0, 1);  // the envelope: node, tenant, forwarded...
    if (q.body_case() == proto::Request::kAlloc && !one_in(4)) {
      // Mostly allocations that can succeed, so later requests have memory.
      q.mutable_alloc()->set_size(1 + below(3 * 4096));
      if (one_in(3)) q.mutable_alloc()->set_name(text(k));
    }
    return q;
  }

  proto::Request hello() {
    proto::Request q;
    q.mutable_hello()->set_protocol_version(one_in(10) ? static_cast<uint32_t>(below(5))
                                                       : static_cast<uint32_t>(proto::PROTOCOL_VERSION_CURRENT));
    return q;
  }

  // One session: the kind of connection, then frames.
  std::string session(const Knowledge& k) {
    std::string out(1, static_cast<char>(below(one_in(4) ? 4 : 3)));
    std::vector<proto::Request> requests;
    if (!one_in(10)) requests.push_back(hello());
    const uint64_t n = 1 + below(12);
    for (uint64_t i = 0; i < n; ++i) requests.push_back(request(k));
    for (proto::Request& q : requests) {
      q.set_id(below(1000));
      std::string body;
      q.SerializeToString(&body);
      const auto header = wire::encode_frame_header(static_cast<uint32_t>(body.size()));
      out.append(reinterpret_cast<const char*>(header.data()), header.size());
      out += body;
    }
    if (one_in(4)) mangle(&out);
    return out;
  }

  // Byte-level damage: flips, cuts, inserted garbage, a frame header lying
  // about its length.
  void mangle(std::string* s) {
    const uint64_t n = 1 + below(8);
    for (uint64_t i = 0; i < n && s->size() > 1; ++i) {
      const size_t at = 1 + below(s->size() - 1);
      switch (below(5)) {
        case 0: (*s)[at] = static_cast<char>((*s)[at] ^ (1 << below(8))); break;
        case 1: s->resize(at); break;
        case 2: s->insert(at, bytes().substr(0, 16)); break;
        case 3: {
          const auto header = wire::encode_frame_header(static_cast<uint32_t>(interesting({})));
          s->replace(at, std::min<size_t>(4, s->size() - at), reinterpret_cast<const char*>(header.data()), 4);
          break;
        }
        default: (*s)[at] = static_cast<char>(m_rng()); break;
      }
    }
  }

 private:
  Rng m_rng;
};

// The input being run, for the crash handler.
const std::string* g_current = nullptr;

void on_crash(int sig) {
  if (g_current != nullptr) {
    const int fd = ::open("fuzz-crash.bin", O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd >= 0) {
      (void)::write(fd, g_current->data(), g_current->size());
      ::close(fd);
    }
    static const char k_msg[] = "structured_fuzz: crashed; the input is in fuzz-crash.bin\n";
    (void)::write(2, k_msg, sizeof k_msg - 1);
  }
  ::signal(sig, SIG_DFL);
  ::raise(sig);
}

struct Options {
  double seconds = 10;
  uint64_t execs = 0;  // 0: no limit but the time
  uint64_t seed = 1;
  std::string corpus_dir;
  uint64_t corpus_count = 0;
};

int usage() {
  std::fprintf(stderr, "usage: structured_fuzz [--seconds S] [--execs N] [--seed X] [--write-corpus DIR COUNT] | --replay FILE...\n");
  return 2;
}

// Each file through a fresh target; 0 when all came back.
int replay(const std::vector<std::string>& files) {
  for (const std::string& file : files) {
    std::ifstream in(file, std::ios::binary);
    if (!in) {
      std::fprintf(stderr, "structured_fuzz: cannot read %s\n", file.c_str());
      return 1;
    }
    const std::string input((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    auto target = RequestTarget::create();
    if (!target) {
      std::fprintf(stderr, "structured_fuzz: cannot make the target's memory\n");
      return 1;
    }
    target->run(reinterpret_cast<const uint8_t*>(input.data()), input.size());
    std::fprintf(stderr, "replayed %s: %zu bytes, %zu responses\n", file.c_str(), input.size(),
                 target->responses().size());
  }
  std::printf("fuzz_replayed %zu\n", files.size());
  return 0;
}

int run(const Options& o) {
  auto target = RequestTarget::create();
  if (!target) {
    std::fprintf(stderr, "structured_fuzz: cannot make the target's memory\n");
    return 1;
  }
  Mutator mutator(o.seed);
  Knowledge knowledge;
  if (!o.corpus_dir.empty()) {
    for (uint64_t i = 0; i < o.corpus_count; ++i) {
      const std::string input = mutator.session(knowledge);
      target->run(reinterpret_cast<const uint8_t*>(input.data()), input.size());
      for (const auto& r : target->responses()) knowledge.learn(r);
      std::ofstream(o.corpus_dir + "/seed-" + std::to_string(i) + ".bin", std::ios::binary) << input;
    }
    std::printf("corpus_inputs %llu\n", static_cast<unsigned long long>(o.corpus_count));
    return 0;
  }
  for (int sig : {SIGSEGV, SIGABRT, SIGBUS, SIGFPE, SIGILL}) ::signal(sig, on_crash);
  const auto start = Clock::now();
  auto last_report = start;
  uint64_t execs = 0, ok = 0, hangs = 0;
  double slowest_ms = 0;
  std::string input;
  g_current = &input;
  for (;;) {
    const double elapsed = std::chrono::duration<double>(Clock::now() - start).count();
    if ((o.execs > 0 && execs >= o.execs) || (o.execs == 0 && elapsed >= o.seconds)) break;
    input = mutator.session(knowledge);
    const auto t0 = Clock::now();
    target->run(reinterpret_cast<const uint8_t*>(input.data()), input.size());
    const double ms = std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
    slowest_ms = std::max(slowest_ms, ms);
    if (ms > 2000) {
      const std::string path = "fuzz-hang-" + std::to_string(hangs++) + ".bin";
      std::ofstream(path, std::ios::binary) << input;
      std::fprintf(stderr, "structured_fuzz: an input took %.0f ms; saved to %s\n", ms, path.c_str());
    }
    for (const auto& r : target->responses()) {
      ok += r.status().code() == 0 ? 1 : 0;
      knowledge.learn(r);
    }
    ++execs;
    if (execs % 20000 == 0) {  // a fresh space now and then: a full one stops allocating
      target->reset();
      knowledge = Knowledge();
    }
    if (Clock::now() - last_report > std::chrono::seconds(5)) {
      last_report = Clock::now();
      std::fprintf(stderr, "fuzz: %llu execs in %.0f s (%.0f/s), %llu requests, %llu ok, %llu hangs\n",
                   static_cast<unsigned long long>(execs), elapsed, execs / std::max(elapsed, 1e-9),
                   static_cast<unsigned long long>(target->requests()), static_cast<unsigned long long>(ok),
                   static_cast<unsigned long long>(hangs));
    }
  }
  g_current = nullptr;
  const double elapsed = std::chrono::duration<double>(Clock::now() - start).count();
  std::printf("fuzz_execs %llu\n", static_cast<unsigned long long>(execs));
  std::printf("fuzz_execs_per_s %.0f\n", execs / std::max(elapsed, 1e-9));
  std::printf("fuzz_requests %llu\n", static_cast<unsigned long long>(target->requests()));
  std::printf("fuzz_ok_responses %llu\n", static_cast<unsigned long long>(ok));
  std::printf("fuzz_hangs %llu\n", static_cast<unsigned long long>(hangs));
  std::printf("fuzz_slowest_ms %.1f\n", slowest_ms);
  return hangs == 0 ? 0 : 1;
}

}  // namespace
}  // namespace tiermem::fuzz

int main(int argc, char** argv) {
  tiermem::fuzz::Options o;
  if (argc >= 3 && std::string(argv[1]) == "--replay") {
    return tiermem::fuzz::replay(std::vector<std::string>(argv + 2, argv + argc));
  }
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--seconds" && i + 1 < argc) {
      o.seconds = std::atof(argv[++i]);
    } else if (a == "--execs" && i + 1 < argc) {
      o.execs = std::strtoull(argv[++i], nullptr, 10);
    } else if (a == "--seed" && i + 1 < argc) {
      o.seed = std::strtoull(argv[++i], nullptr, 10);
    } else if (a == "--write-corpus" && i + 2 < argc) {
      o.corpus_dir = argv[++i];
      o.corpus_count = std::strtoull(argv[++i], nullptr, 10);
    } else {
      return tiermem::fuzz::usage();
    }
  }
  if (!o.corpus_dir.empty()) return tiermem::fuzz::run(o);
  std::fflush(stdout);
  const pid_t child = ::fork();
  if (child == 0) {
    const int rc = tiermem::fuzz::run(o);
    std::fflush(stdout);
    ::_exit(rc);
  }
  int status = 0;
  ::waitpid(child, &status, 0);
  const bool crashed = WIFSIGNALED(status);
  std::printf("fuzz_crashes %d\n", crashed ? 1 : 0);
  if (crashed) {
    std::fprintf(stderr, "structured_fuzz: the fuzzing process died of signal %d (input in fuzz-crash.bin)\n",
                 WTERMSIG(status));
    return 1;
  }
  return WIFEXITED(status) ? WEXITSTATUS(status) : 1;
}
