#include "executor/trace.hpp"

#include <cstdio>

namespace tiermem::exec {

void Trace::add(SpanKind kind, const std::string* name, std::chrono::steady_clock::time_point begin,
                std::chrono::steady_clock::time_point end) {
  m_totals[static_cast<size_t>(kind)] += std::chrono::duration<double>(end - begin).count();
  if (!m_record) return;
  m_events.push_back({name, kind, std::chrono::duration_cast<std::chrono::nanoseconds>(begin - m_start).count(),
                      std::chrono::duration_cast<std::chrono::nanoseconds>(end - m_start).count()});
}

Status Trace::write(const std::string& path, int rank) const {
  std::FILE* f = std::fopen(path.c_str(), "w");
  if (f == nullptr) return Status(ErrorCode::io_error, "cannot write trace " + path);
  static const char* const k_cat[] = {"compute", "comm", "sync"};
  std::fprintf(f, "{\"displayTimeUnit\":\"ms\",\"traceEvents\":[\n");
  auto escaped = [](const std::string& text) {
    std::string out;
    for (char c : text) {
      if (c == '"' || c == '\\') out += '\\';
      out += c;
    }
    return out;
  };
  std::fprintf(f, "{\"name\":\"process_name\",\"ph\":\"M\",\"pid\":%d,\"args\":{\"name\":\"rank %d%s%s\"}}", rank, rank,
               m_label.empty() ? "" : ": ", escaped(m_label).c_str());
  for (const Event& e : m_events) {
    const std::string name = escaped(*e.name);
    std::fprintf(f, ",\n{\"name\":\"%s\",\"cat\":\"%s\",\"ph\":\"X\",\"ts\":%.3f,\"dur\":%.3f,\"pid\":%d,\"tid\":%d}",
                 name.c_str(), k_cat[static_cast<size_t>(e.kind)], static_cast<double>(e.begin_ns) / 1e3,
                 static_cast<double>(e.end_ns - e.begin_ns) / 1e3, rank, static_cast<int>(e.kind));
  }
  std::fprintf(f, "\n]}\n");
  const bool ok = std::fclose(f) == 0;
  return ok ? Status() : Status(ErrorCode::io_error, "writing trace " + path + " failed");
}

}  // namespace tiermem::exec
