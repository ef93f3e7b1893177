// tiermemctl stats [PREFIX]: the node's counters and gauges as its metrics
// endpoint shows them (Prometheus text format), one row per series.
#include <cstdio>
#include <sstream>

#include "tools/tiermemctl/ctl.hpp"

namespace tiermem::ctl {
namespace {

struct Series {
  std::string name;
  std::vector<std::pair<std::string, std::string>> labels;
  std::string value;
};

// One sample line of the exposition: name{k="v",...} value. Our daemon
// writes it, so the grammar needed is that of its writer (escaped \\ " \n).
bool parse_sample(const std::string& line, Series* out) {
  size_t i = line.find_first_of("{ ");
  if (i == std::string::npos) return false;
  out->name = line.substr(0, i);
  out->labels.clear();
  if (line[i] == '{') {
    ++i;
    while (i < line.size() && line[i] != '}') {
      const size_t eq = line.find('=', i);
      if (eq == std::string::npos || eq + 1 >= line.size() || line[eq + 1] != '"') return false;
      std::string key = line.substr(i, eq - i), value;
      size_t j = eq + 2;
      for (; j < line.size() && line[j] != '"'; ++j) {
        if (line[j] == '\\' && j + 1 < line.size()) {
          ++j;
          value.push_back(line[j] == 'n' ? '\n' : line[j]);
        } else {
          value.push_back(line[j]);
        }
      }
      out->labels.emplace_back(std::move(key), std::move(value));
      i = j + 1;
      if (i < line.size() && line[i] == ',') ++i;
    }
    ++i;  // the '}'
  }
  while (i < line.size() && line[i] == ' ') ++i;
  out->value = line.substr(i);
  return !out->value.empty();
}

}  // namespace

int cmd_stats(const Context& ctx, const std::string& prefix, bool buckets) {
  auto client = connect(ctx);
  if (!client) return k_exit_failed;
  auto text = client->metrics(ctx.node);
  if (!text.ok()) return fail("stats", text.status());
  std::istringstream in(*text);
  std::string line;
  std::vector<Series> series;
  while (std::getline(in, line)) {
    if (line.empty() || line[0] == '#') continue;
    Series s;
    if (!parse_sample(line, &s)) continue;
    if (!prefix.empty() && s.name.rfind(prefix, 0) != 0 && s.name.rfind("tiermem_" + prefix, 0) != 0) continue;
    if (!buckets && s.name.size() > 7 && s.name.compare(s.name.size() - 7, 7, "_bucket") == 0) continue;
    series.push_back(std::move(s));
  }
  if (ctx.json) {
    nlohmann::json out = nlohmann::json::array();
    for (const Series& s : series) {
      nlohmann::json labels = nlohmann::json::object();
      for (const auto& [k, v] : s.labels) labels[k] = v;
      out.push_back({{"name", s.name}, {"labels", labels}, {"value", std::stod(s.value)}});
    }
    print_json(out);
    return k_exit_ok;
  }
  Table table({"METRIC", "LABELS", "VALUE"});
  for (const Series& s : series) {
    std::string labels;
    for (const auto& [k, v] : s.labels) {
      if (k == "node") continue;  // one node per call
      labels += (labels.empty() ? "" : " ") + k + "=" + v;
    }
    table.add({s.name, labels.empty() ? "-" : labels, s.value});
  }
  std::fputs(table.render().c_str(), stdout);
  return k_exit_ok;
}

}  // namespace tiermem::ctl
