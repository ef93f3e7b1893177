// tiermemctl: operator's command line for tiermem.
#include <CLI/CLI.hpp>

#include "tiermem_config.h"
#include "tools/tiermemctl/ctl.hpp"

int main(int argc, char** argv) {
  using namespace tiermem::ctl;
  CLI::App app{"tiermemctl: inspect and operate a tiermem node"};
  app.require_subcommand(1);
  app.set_version_flag("--version", std::string("tiermemctl ") + TIERMEM_VERSION);
  Context ctx;
  app.add_option("-s,--socket", ctx.socket, "tiermemd control socket (default: $TIERMEM_SOCKET, else /run/tiermem/tiermemd.sock)");
  app.add_flag("--json", ctx.json, "print JSON for machines instead of tables");
  app.add_option("-N,--node", ctx.node, "node that status, ls, dump and alloc are about (default: the local one)");

  int rc = k_exit_ok;
  app.add_subcommand("status", "node, tiers and their use")->callback([&] { rc = cmd_status(ctx); });
  app.add_subcommand("ls", "list allocations")->callback([&] { rc = cmd_ls(ctx); });

  std::string size, tier = "auto", name;
  bool strict = false, coherent = false;
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
      ->check(CLI::Range(0u, tiermem::k_max_replicas));
  alloc->add_option("--qos", qos, "default QoS class of calls on it: standard, strict, best_effort, "
                                  "graceful_degrade");
  alloc->callback([&] { rc = cmd_alloc(ctx, size, tier, name, strict, coherent, replicas, qos); });

  std::string gva, file = "-", length;
  auto* free = app.add_subcommand("free", "free the allocation starting at GVA");
  free->add_option("GVA", gva, "NNNN:OOOOOOOOOOOOOOOO")->required();
  free->callback([&] { rc = cmd_free(ctx, gva); });

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
  migrate->add_option("-n,--to-node", ctx.node, "node to move to (default: the allocation's home)");
  migrate->callback([&] { rc = cmd_migrate(ctx, gva, tier); });

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    const int code = app.exit(e);
    return code == 0 ? k_exit_ok : k_exit_usage;
  }
  return rc;
}
