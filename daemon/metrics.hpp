// What the daemon counts for its Prometheus endpoint (O4): requests by type,
// result and tenant, their latency by type, and the bytes it carried; and
// the writer of the text exposition format (version 0.0.4) that the
// endpoint serves, gauges of the moment included (RequestHandler::metrics).
//
// Counting is a mutex and a few map lookups per request: the control-plane
// benchmark measures what it costs (bench/control_plane_bench, metrics on
// against off).
#pragma once

#include <array>
#include <chrono>
#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <string_view>
#include <tuple>
#include <utility>
#include <vector>

#include <tiermem/status.h>

namespace tiermem {

// Writes the text exposition: families in order, each with its HELP and TYPE
// once, then its samples. Label values are escaped; names are ours.
class Exposition {
 public:
  using Labels = std::vector<std::pair<std::string_view, std::string>>;

  // Starts a family: `type` is "counter", "gauge" or "histogram".
  void family(std::string_view name, std::string_view type, std::string_view help);
  void sample(std::string_view name, const Labels& labels, double value);
  void sample(std::string_view name, const Labels& labels, uint64_t value);

  std::string take() { return std::move(m_out); }

 private:
  void labels(const Labels& labels);
  std::string m_out;
};

class Metrics {
 public:
  // Upper bounds of the latency buckets, in seconds (50 us .. 10 s).
  static constexpr std::array<double, 16> k_buckets = {50e-6, 100e-6, 250e-6, 500e-6, 1e-3, 2.5e-3, 5e-3, 10e-3,
                                                       25e-3, 50e-3,  100e-3, 250e-3, 500e-3, 1.0,  2.5,    10.0};

  // One request answered: its type (the request's body field, "alloc"), its
  // result (the error code's name, "ok"), who asked, and how long it took.
  void request(std::string_view type, ErrorCode result, const std::string& tenant, std::chrono::nanoseconds took);
  // Bytes the daemon carried for `tenant` (`path`: "read", "write",
  // "migrate", "replicate").
  void bytes(std::string_view path, const std::string& tenant, uint64_t n);

  // The counter and histogram families, with `node` as a label.
  void render(Exposition& out, const std::string& node) const;

 private:
  struct Histogram {
    std::array<uint64_t, k_buckets.size()> buckets{};  // not cumulative here
    uint64_t count = 0;
    double sum = 0;
  };
  mutable std::mutex m_mutex;
  std::map<std::tuple<std::string, std::string, std::string>, uint64_t> m_requests;  // type, result, tenant
  std::map<std::string, Histogram, std::less<>> m_latency;                           // by type
  std::map<std::pair<std::string, std::string>, uint64_t> m_bytes;                  // path, tenant
};

}  // namespace tiermem
