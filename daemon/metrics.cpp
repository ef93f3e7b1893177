#include "daemon/metrics.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>

namespace tiermem {
namespace {

// A sample value as the format writes it (integers without exponent).
std::string number(double v) {
  if (std::isnan(v)) return "NaN";
  if (std::isinf(v)) return v > 0 ? "+Inf" : "-Inf";
  char buf[40];
  if (v == std::floor(v) && std::fabs(v) < 1e15) {
    std::snprintf(buf, sizeof buf, "%.0f", v);
  } else {
    std::snprintf(buf, sizeof buf, "%.9g", v);
  }
  return buf;
}

}  // namespace

void Exposition::family(std::string_view name, std::string_view type, std::string_view help) {
  m_out.append("# HELP ").append(name).append(" ").append(help).append("\n");
  m_out.append("# TYPE ").append(name).append(" ").append(type).append("\n");
}

void Exposition::labels(const Labels& labels) {
  if (labels.empty()) return;
  m_out.push_back('{');
  bool first = true;
  for (const auto& [key, value] : labels) {
    if (!first) m_out.push_back(',');
    first = false;
    m_out.append(key).append("=\"");
    for (char c : value) {
      if (c == '\\') {
        m_out.append("\\\\");
      } else if (c == '"') {
        m_out.append("\\\"");
      } else if (c == '\n') {
        m_out.append("\\n");
      } else {
        m_out.push_back(c);
      }
    }
    m_out.push_back('"');
  }
  m_out.push_back('}');
}

void Exposition::sample(std::string_view name, const Labels& l, double value) {
  m_out.append(name);
  labels(l);
  m_out.append(" ").append(number(value)).append("\n");
}

void Exposition::sample(std::string_view name, const Labels& l, uint64_t value) {
  m_out.append(name);
  labels(l);
  m_out.append(" ").append(std::to_string(value)).append("\n");
}

void Metrics::request(std::string_view type, ErrorCode result, const std::string& tenant,
                      std::chrono::nanoseconds took) {
  const double seconds = std::chrono::duration<double>(took).count();
  const size_t bucket = static_cast<size_t>(
      std::lower_bound(k_buckets.begin(), k_buckets.end(), seconds) - k_buckets.begin());
  std::lock_guard lock(m_mutex);
  ++m_requests[{std::string(type), std::string(error_code_name(result)), tenant}];
  auto it = m_latency.find(type);
  if (it == m_latency.end()) it = m_latency.emplace(std::string(type), Histogram{}).first;
  Histogram& h = it->second;
  if (bucket < h.buckets.size()) ++h.buckets[bucket];  // beyond the last: only in +Inf (the count)
  ++h.count;
  h.sum += seconds;
}

void Metrics::bytes(std::string_view path, const std::string& tenant, uint64_t n) {
  if (n == 0) return;
  std::lock_guard lock(m_mutex);
  m_bytes[{std::string(path), tenant}] += n;
}

void Metrics::render(Exposition& out, const std::string& node) const {
  std::lock_guard lock(m_mutex);
  out.family("tiermem_requests_total", "counter",
             "Control requests answered, by type (the request's body), result (ok or the error code) and tenant.");
  for (const auto& [key, n] : m_requests) {
    const auto& [type, result, tenant] = key;
    out.sample("tiermem_requests_total", {{"node", node}, {"type", type}, {"result", result}, {"tenant", tenant}}, n);
  }
  out.family("tiermem_request_duration_seconds", "histogram",
             "Time from a request's arrival to its answer, blocking work (peers, migration) included, by type.");
  for (const auto& [type, h] : m_latency) {
    uint64_t cumulative = 0;
    for (size_t i = 0; i < k_buckets.size(); ++i) {
      cumulative += h.buckets[i];
      out.sample("tiermem_request_duration_seconds_bucket",
                 {{"node", node}, {"type", type}, {"le", number(k_buckets[i])}}, cumulative);
    }
    out.sample("tiermem_request_duration_seconds_bucket", {{"node", node}, {"type", type}, {"le", "+Inf"}}, h.count);
    out.sample("tiermem_request_duration_seconds_sum", {{"node", node}, {"type", type}}, h.sum);
    out.sample("tiermem_request_duration_seconds_count", {{"node", node}, {"type", type}}, h.count);
  }
  out.family("tiermem_daemon_bytes_total", "counter",
             "Bytes the daemon carried itself, by path (read, write: through the daemon; migrate; replicate: to "
             "copies) and tenant. Clients' direct copies and one-sided accesses do not pass through it.");
  for (const auto& [key, n] : m_bytes) {
    out.sample("tiermem_daemon_bytes_total", {{"node", node}, {"path", key.first}, {"tenant", key.second}}, n);
  }
}

}  // namespace tiermem
