// Per-op and per-transfer timings (X13), written as a Chrome/Perfetto trace
// (chrome://tracing, ui.perfetto.dev) and summed up for the step summary.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

#include <tiermem/status.h>

namespace tiermem::exec {

enum class SpanKind { compute, comm, sync };

class Trace {
 public:
  explicit Trace(bool record) : m_record(record), m_start(std::chrono::steady_clock::now()) {}

  class Span {
   public:
    Span(Trace& trace, SpanKind kind, const std::string* name)
        : m_trace(trace), m_kind(kind), m_name(name), m_begin(std::chrono::steady_clock::now()) {}
    ~Span() { m_trace.add(m_kind, m_name, m_begin, std::chrono::steady_clock::now()); }

   private:
    Trace& m_trace;
    SpanKind m_kind;
    const std::string* m_name;
    std::chrono::steady_clock::time_point m_begin;
  };
  // `name` must outlive the trace (op and tensor names do).
  Span span(SpanKind kind, const std::string& name) { return Span(*this, kind, &name); }

  // Seconds spent in each kind since the last reset (always counted).
  double seconds(SpanKind kind) const { return m_totals[static_cast<size_t>(kind)]; }
  void reset_totals() { m_totals[0] = m_totals[1] = m_totals[2] = 0; }

  // Writes the Chrome trace JSON (rank = process id in the trace).
  Status write(const std::string& path, int rank) const;
  // Words after "rank N" in the trace's name of the process (its stage, the
  // predicted and measured step time).
  void set_label(std::string label) { m_label = std::move(label); }

 private:
  struct Event {
    const std::string* name;
    SpanKind kind;
    int64_t begin_ns, end_ns;
  };
  void add(SpanKind kind, const std::string* name, std::chrono::steady_clock::time_point begin,
           std::chrono::steady_clock::time_point end);

  bool m_record;
  std::string m_label;
  std::chrono::steady_clock::time_point m_start;
  std::vector<Event> m_events;
  double m_totals[3] = {0, 0, 0};
};

}  // namespace tiermem::exec
