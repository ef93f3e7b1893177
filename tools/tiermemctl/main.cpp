// tiermemctl: operator's command line for tiermem.
#include <algorithm>
#include <charconv>
#include <string_view>
#include <vector>

#include <CLI/CLI.hpp>

#include "common/cli_man.hpp"

#include "tiermem_config.h"
#include "tools/tiermemctl/ctl.hpp"

namespace {

size_t edit_distance(std::string_view a, std::string_view b) {
  std::vector<size_t> row(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    size_t diagonal = row[0];
    row[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      const size_t up = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diagonal + (a[i - 1] == b[j - 1] ? 0 : 1)});
      diagonal = up;
    }
  }
  return row[b.size()];
}

// The first word that is not an option (nor an option's value) must be a
// subcommand: "unknown command 'lss'; did you mean 'ls'?" otherwise.
std::string unknown_subcommand(CLI::App& app, int argc, char** argv) {
  for (int i = 1; i < argc; ++i) {
    const std::string_view word = argv[i];
    if (word == "-s" || word == "--socket" || word == "-N" || word == "--node") {
      ++i;  // its value
      continue;
    }
    if (word.empty() || word[0] == '-') continue;
    std::string best;
    size_t best_distance = 3;  // suggest within two edits, or a prefix
    for (const CLI::App* sub : app.get_subcommands([](const CLI::App*) { return true; })) {
      const std::string& name = sub->get_name();
      if (name == word) return "";
      const size_t d = name.rfind(word, 0) == 0 ? 1 : edit_distance(word, name);
      if (d < best_distance) {
        best_distance = d;
        best = name;
      }
    }
    return "unknown command '" + std::string(word) + "'" + (best.empty() ? "" : "; did you mean '" + best + "'?") +
           " (tiermemctl --help lists them)";
  }
  return "";
}

// A whole number from `min` to `max`, checked before CLI11 converts it (its
// own message for 70000 as a uint16_t is "Could not convert"): CLI11 prints
// "--node: 70000 is out of range: node ids are 1-65535".
CLI::Validator in_range(uint64_t min, uint64_t max, const std::string& what) {
  const std::string range = std::to_string(min) + "-" + std::to_string(max);
  return CLI::Validator(
      [=](std::string& text) -> std::string {
        uint64_t value = 0;
        const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
        if (text.empty() || end != text.data() + text.size() || (ec != std::errc() && ec != std::errc::result_out_of_range)) {
          return "'" + text + "' is not a whole number: " + what + " are " + range;
        }
        if (ec == std::errc::result_out_of_range || value < min || value > max) {
          return text + " is out of range: " + what + " are " + range;
        }
        return "";
      },
      range);
}

}  // namespace

int main(int argc, char** argv) {
  using namespace tiermem::ctl;
  CLI::App app{"tiermemctl: inspect and operate a tiermem node"};
  app.require_subcommand(1);
  app.set_version_flag("--version", std::string("tiermemctl ") + TIERMEM_VERSION);
  Context ctx;
  app.add_option("-s,--socket", ctx.socket, "tiermemd control socket (default: $TIERMEM_SOCKET, else /run/tiermem/tiermemd.sock)");
  app.add_flag("--json", ctx.json, "print JSON for machines instead of tables");
  app.add_option("-N,--node", ctx.node, "node that status, ls, dump and alloc are about (default: the local one)")
      ->check(in_range(1, 0xffff, "node ids"));

  int rc = k_exit_ok;
  app.add_subcommand("status", "node, tiers and their use")->callback([&] { rc = cmd_status(ctx); });
  Filter filter;
  auto* ls = app.add_subcommand("ls", "list allocations (of a name prefix, tenant or tier)");
  ls->add_option("--name-prefix", filter.name_prefix, "only those whose name starts so");
  ls->add_option("--tenant", filter.tenant, "only the tenant's");
  ls->add_option("--tier", filter.tier, "only those on vram, dram or pmem");
  ls->callback([&] { rc = cmd_ls(ctx, filter); });

  std::string lookup_name;
  auto* lookup = app.add_subcommand("lookup", "find a named allocation");
  lookup->add_option("NAME", lookup_name, "its name")->required();
  lookup->callback([&] { rc = cmd_lookup(ctx, lookup_name); });

  std::string job_name;
  auto* job = app.add_subcommand("job", "a training job's memory: each rank's tensor classes (parameters, gradients, "
                                        "optimizer state, activations, ...) with their tier and node, and the bytes "
                                        "its last step moved between the tiers");
  job->add_option("NAME", job_name, "the job (tiermem-exec train --job NAME)")->required();
  job->callback([&] { rc = cmd_job(ctx, job_name); });

  std::string stats_prefix;
  bool buckets = false;
  auto* stats = app.add_subcommand("stats", "counters and gauges, as the metrics endpoint shows them (operators)");
  stats->add_option("PREFIX", stats_prefix, "only metrics whose name starts so (tiermem_ may be left out)");
  stats->add_flag("--buckets", buckets, "histogram buckets too");
  stats->callback([&] { rc = cmd_stats(ctx, stats_prefix, buckets); });

  std::string size, tier = "auto", name;
  bool strict = false, coherent = false, demotable = false;
  uint32_t replicas = 0;
  std::string qos = "standard";
  auto* alloc = app.add_subcommand(
      "alloc", "allocate memory and print its GVA; it is persistent: kept until freed, through daemon restarts "
               "(DRAM until the node reboots)");
  alloc->add_option("SIZE", size, "bytes, or with a unit: 64KiB, 2MiB, 1GiB")->required();
  alloc->add_option("-t,--tier", tier, "vram, dram, pmem or auto")->capture_default_str();
  alloc->add_option("-n,--name", name, "name to find it again with lookup");
  alloc->add_flag("--strict", strict, "fail rather than fall back to a slower tier");
  alloc->add_flag("--coherent", coherent, "holds atomic words: never migrated");
  alloc->add_option("--replicas", replicas, "copies on other nodes (written with every write, read when the home "
                                            "is down)")
      ->check(in_range(0, tiermem::k_max_replicas, "replicas"));
  alloc->add_option("--qos", qos, "default QoS class of calls on it: standard, strict, best_effort, "
                                  "graceful_degrade");
  alloc->add_flag("--demotable", demotable, "its cold pages may move to the next tier down when its tier passes "
                                            "the daemon's high-water mark ([demotion])");
  alloc->callback([&] {
    rc = cmd_alloc(ctx, size, tier, name, {.strict = strict, .coherent = coherent, .demotable = demotable}, replicas,
                   qos);
  });

  std::string gva, file = "-", length;
  Filter free_filter;
  bool dry_run = false;
  auto* free = app.add_subcommand("free", "free the allocation starting at GVA, or every one of a name prefix or "
                                          "tenant");
  free->add_option("GVA", gva, "NNNN:OOOOOOOOOOOOOOOO");
  free->add_option("--name-prefix", free_filter.name_prefix, "every allocation whose name starts so");
  free->add_option("--tenant", free_filter.tenant, "every allocation of the tenant");
  free->add_option("--tier", free_filter.tier, "with a prefix or tenant: only those on this tier");
  free->add_flag("--dry-run", dry_run, "only say what would be freed");
  free->callback([&] {
    if (!gva.empty() && (free_filter.any() || dry_run)) {
      rc = usage_error("free takes a GVA, or --name-prefix P and/or --tenant T (not both a GVA and a filter)");
    } else if (gva.empty() && free_filter.name_prefix.empty() && free_filter.tenant.empty()) {
      rc = usage_error("free needs a GVA, or --name-prefix P and/or --tenant T (--tier alone would free a whole tier)");
    } else {
      rc = gva.empty() ? cmd_free_matching(ctx, free_filter, dry_run) : cmd_free(ctx, gva);
    }
  });

  auto* write = app.add_subcommand("write", "copy FILE (or stdin) into memory at GVA");
  write->add_option("GVA", gva, "NNNN:OOOOOOOOOOOOOOOO")->required();
  write->add_option("FILE", file, "file to copy, or - for stdin")->capture_default_str();
  write->callback([&] { rc = cmd_write(ctx, gva, file); });

  auto* read = app.add_subcommand("read", "copy LENGTH bytes at GVA to stdout");
  read->add_option("GVA", gva, "NNNN:OOOOOOOOOOOOOOOO")->required();
  read->add_option("LENGTH", length, "bytes, or with a unit")->required();
  read->callback([&] { rc = cmd_read(ctx, gva, length); });

  auto* translate = app.add_subcommand("translate", "show where GVA lives: page entry and frames");
  translate->add_option("GVA", gva, "NNNN:OOOOOOOOOOOOOOOO")->required();
  translate->callback([&] { rc = cmd_translate(ctx, gva); });

  app.add_subcommand("dump", "print the mapping table")->callback([&] { rc = cmd_dump(ctx); });
  app.add_subcommand("nodes", "the cluster: peers, their state and the data plane to them")
      ->callback([&] { rc = cmd_nodes(ctx); });
  app.add_subcommand("health", "the health graph: each node's health and the heartbeat edges between daemons")
      ->callback([&] { rc = cmd_health(ctx); });

  auto* migrate = app.add_subcommand("migrate", "move an allocation to another tier and/or node");
  migrate->add_option("GVA", gva, "NNNN:OOOOOOOOOOOOOOOO")->required();
  migrate->add_option("-t,--tier", tier, "vram, dram or pmem")->required();
  migrate->add_option("-n,--to-node", ctx.node, "node to move to (default: the allocation's home)")
      ->check(in_range(1, 0xffff, "node ids"));
  migrate->callback([&] { rc = cmd_migrate(ctx, gva, tier); });

  for (int i = 1; i < argc; ++i) {
    if (std::string_view(argv[i]) == "--json") set_json_errors(true);
  }
  if (const std::string unknown = unknown_subcommand(app, argc, argv); !unknown.empty()) {
    return usage_error(unknown);
  }
  tiermem::add_man_flag(app, {.name = "tiermemctl",
                     .section = 8,
                     .summary = "inspect and operate a tiermem node",
                     .source = std::string("tiermem ") + TIERMEM_VERSION,
                     .see_also = {"tiermemd(8)", "tiermemd.toml(5)", "tiermem-exec(1)"},
                     .extra = ".SH ENVIRONMENT\n.TP\nTIERMEM_SOCKET\nthe daemon's socket when --socket is not "
                              "given\n.SH EXIT STATUS\n0 on success; 1 when the request failed (one line on stderr, "
                              "or JSON with --json); 2 on bad usage.\n"});
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    if (e.get_exit_code() != 0 && ctx.json) return usage_error(e.what());
    const int code = app.exit(e);
    return code == 0 ? k_exit_ok : k_exit_usage;
  }
  return rc;
}
