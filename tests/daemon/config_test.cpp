#include "daemon/cluster_file.hpp"
#include "daemon/config.hpp"

#include <gtest/gtest.h>

#include <fstream>
#include <sstream>

namespace tiermem {
namespace {

TEST(ConfigTest, EmptyFileGivesTheDocumentedDefaults) {
  auto c = parse_config("", "empty.toml");
  ASSERT_TRUE(c.ok()) << c.status().to_string();
  EXPECT_EQ(c->node_id, 1);
  EXPECT_EQ(c->page_size, 2u << 20);
  EXPECT_EQ(c->socket_path, "/run/tiermem/tiermemd.sock");
  EXPECT_EQ(c->socket_mode, 0660u);
  EXPECT_EQ(c->sub_page_bytes(), 256u << 10) << "an eighth of a page";
  EXPECT_EQ(c->frame_budget_bytes, 256u << 20);
  EXPECT_EQ(c->frame_budget_per_uid_bytes, 64u << 20);
  auto small_pages = parse_config("[mapping]\npage_size = \"64KiB\"\n", "small.toml");
  ASSERT_TRUE(small_pages.ok());
  EXPECT_EQ(small_pages->sub_page_bytes(), 8u << 10) << "follows the page size when left out";
  auto none = parse_config("[mapping]\nsub_page_max = 0\n", "none.toml");
  ASSERT_TRUE(none.ok()) << none.status().to_string();
  EXPECT_EQ(none->sub_page_bytes(), 0u);
}

TEST(ConfigTest, ReadsEveryKind) {
  auto c = parse_config(R"(
[node]
id = 7
[control]
socket = "/tmp/x.sock"
socket_mode = "0600"
max_frame_bytes = "32MiB"
max_inline_bytes = 1048576
[mapping]
page_size = "64KiB"
[tiers.dram]
capacity = "3GiB"
[tiers.pmem]
enabled = false
[tiers.vram]
required = true
device = 1
pin_dram = false
[log]
level = "debug"
)", "full.toml");
  ASSERT_TRUE(c.ok()) << c.status().to_string();
  EXPECT_EQ(c->node_id, 7);
  EXPECT_EQ(c->socket_mode, 0600u);
  EXPECT_EQ(c->max_frame_bytes, 32u << 20);
  EXPECT_EQ(c->max_inline_bytes, 1u << 20);
  EXPECT_EQ(c->page_size, 64u << 10);
  EXPECT_EQ(c->dram_capacity, uint64_t{3} << 30);
  EXPECT_FALSE(c->pmem_enabled);
  EXPECT_TRUE(c->vram_required);
  EXPECT_EQ(c->vram_device, 1);
  EXPECT_FALSE(c->vram_pin_dram);
  EXPECT_EQ(c->log_level, "debug");
}

void expect_error(const std::string& text, const std::string& fragment) {
  auto c = parse_config(text, "bad.toml");
  ASSERT_FALSE(c.ok()) << "accepted: " << text;
  EXPECT_EQ(c.status().code(), ErrorCode::config_error);
  EXPECT_NE(c.status().message().find(fragment), std::string::npos)
      << "message '" << c.status().message() << "' lacks '" << fragment << "'";
  EXPECT_EQ(c.status().message().rfind("bad.toml", 0), 0u) << "names the file first";
}

TEST(ConfigTest, RejectsBadInputWithFileLineAndKey) {
  expect_error("[node]\nid = 1\ncolour = 3\n", "bad.toml:3: node.colour is not a known key");
  expect_error("[nodes]\nid = 1\n", "nodes is not a known section");
  expect_error("[node]\nid = \"one\"\n", "node.id must be an integer");
  expect_error("[node]\nid = 0\n", "node.id must be between 1 and 65535");
  expect_error("[mapping]\npage_size = \"3KiB\"\n", "power of two");
  expect_error("[tiers.dram]\ncapacity = \"lots\"\n", "invalid size 'lots'");
  expect_error("[control]\nsocket_mode = 660\n", "octal mode");
  expect_error("[log]\nlevel = \"loud\"\n", "log.level 'loud'");
  expect_error("[node\nid = 1\n", "bad.toml:1");
  expect_error("[tiers.dram]\nenabled = false\n[tiers.pmem]\nenabled = false\n[tiers.vram]\nenabled = false\n",
               "every tier is disabled");
  expect_error("[control]\nmax_frame_bytes = \"1MiB\"\nmax_inline_bytes = \"1MiB\"\n", "max_inline_bytes");
  // Overflowing numbers are errors, never an exception out of the parser.
  expect_error("[control]\nsocket_mode = \"77777777777777777777777\"\n", "bad.toml:2: control.socket_mode must be an octal mode");
  expect_error("[control]\nsocket_mode = \"\"\n", "octal mode");
  expect_error("[control]\nsocket_mode = \"1777\"\n", "octal mode");
  expect_error("[control]\nsocket_group = \"no-such-group-here\"\n",
               "bad.toml: control.socket_group = \"no-such-group-here\": is not a group on this machine; expected a "
               "group's name or number");
  expect_error("[metrics]\nlisten = \"127.0.0.1\"\n", "metrics.listen '127.0.0.1' is not host:port");
  expect_error("[metrics]\nlisten = \"127.0.0.1:99999\"\n", "is not host:port");
  expect_error("[metrics]\nenabled = false\nlisten = \"127.0.0.1:9464\"\n", "metrics.enabled is false");
  expect_error("[lease]\ngrace_ms = -1\n", "lease.grace_ms must be between 0 and 3600000");
  expect_error("[mapping]\npage_size = \"64KiB\"\nsub_page_max = \"64KiB\"\n",
               "mapping.sub_page_max 64 KiB is more than half a page (64 KiB)");
  // Accepted once, then every request failed (the client cut it to 32 bits).
  expect_error("[control]\nmax_frame_bytes = \"8GiB\"\n", "control.max_frame_bytes 8 GiB is more than a frame can be");
  // A frame budget smaller than a frame: that frame could never be read.
  expect_error("[control]\nmax_frame_bytes = \"32MiB\"\nframe_budget_bytes = \"16MiB\"\n",
               "control.frame_budget_bytes 16 MiB is less than control.max_frame_bytes (32 MiB)");
  expect_error("[control]\nmax_frame_bytes = \"128MiB\"\nframe_budget_bytes = \"1GiB\"\n",
               "control.frame_budget_per_uid_bytes 64 MiB is less than control.max_frame_bytes (128 MiB)");
  // Demotion moves pages until a tier is under the low mark: it must be below the high one.
  expect_error("[demotion]\nhigh_water_percent = 70\nlow_water_percent = 70\n",
               "demotion.low_water_percent 70 must be below demotion.high_water_percent 70");
  expect_error("[demotion]\nhigh_water_percent = 101\n", "demotion.high_water_percent");
  // Accepted once, and 5.7 GB of /dev/shm filled in 1.5 s.
  expect_error("[tiers.dram]\ncapacity = \"100000GiB\"\n", "is more than this machine's memory");
}

TEST(ConfigTest, FabricIsUcxUnlessLibfabricIsChosen) {
  auto ucx = parse_config("", "empty.toml");
  ASSERT_TRUE(ucx.ok()) << ucx.status().to_string();
  EXPECT_EQ(ucx->transport_fabric, "ucx");
  EXPECT_EQ(ucx->transport_provider, "") << "a provider is libfabric's";
  auto ofi = parse_config("[transport]\nfabric = \"libfabric\"\n", "ofi.toml");
  ASSERT_TRUE(ofi.ok()) << ofi.status().to_string();
  EXPECT_EQ(ofi->transport_fabric, "libfabric");
  EXPECT_EQ(ofi->transport_provider, "tcp;ofi_rxm") << "the default provider";
  auto shm = parse_config("[transport]\nfabric = \"libfabric\"\nprovider = \"shm\"\n", "shm.toml");
  ASSERT_TRUE(shm.ok()) << shm.status().to_string();
  EXPECT_EQ(shm->transport_provider, "shm");
  // The shipped file writes the UCX keys empty: they may stay so with libfabric.
  auto empty_ucx_keys = parse_config(
      "[transport]\nfabric = \"libfabric\"\nprovider = \"verbs;ofi_rxm\"\ntls = \"\"\ndevices = \"\"\n", "e.toml");
  ASSERT_TRUE(empty_ucx_keys.ok()) << empty_ucx_keys.status().to_string();
  EXPECT_EQ(empty_ucx_keys->transport_provider, "verbs;ofi_rxm");
  auto empty_provider = parse_config("[transport]\nprovider = \"\"\n", "p.toml");
  EXPECT_TRUE(empty_provider.ok()) << "an empty provider is no provider: " << empty_provider.status().to_string();
}

TEST(ConfigTest, RejectsKeysOfTheOtherFabricAndUnknownFabrics) {
  expect_error("[transport]\nfabric = \"rdma\"\n",
               "bad.toml: transport.fabric = \"rdma\" is not a fabric; expected \"ucx\" (the default) or "
               "\"libfabric\"");
  expect_error("[transport]\nfabric = \"UCX\"\n", "transport.fabric = \"UCX\" is not a fabric");
  expect_error("[transport]\nprovider = \"shm\"\n",
               "bad.toml: transport.provider = \"shm\" is libfabric's, but transport.fabric is \"ucx\"");
  expect_error("[transport]\nfabric = \"ucx\"\nprovider = \"tcp;ofi_rxm\"\n",
               "transport.provider = \"tcp;ofi_rxm\" is libfabric's");
  expect_error("[transport]\nfabric = \"libfabric\"\ntls = \"tcp\"\n",
               "bad.toml: transport.tls = \"tcp\" with transport.fabric = \"libfabric\": tls and devices are UCX's; "
               "libfabric takes provider");
  expect_error("[transport]\nfabric = \"libfabric\"\nprovider = \"shm\"\ndevices = \"lo\"\n",
               "transport.devices = \"lo\" with transport.fabric = \"libfabric\": tls and devices are UCX's; "
               "libfabric takes provider");
  expect_error("[transport]\nfabric = \"libfabric\"\nprovider = \"tcp ofi_rxm\"\n",
               "transport.provider = \"tcp ofi_rxm\" is not a provider's name");
  expect_error("[transport]\nfabric = 1\n", "bad.toml:2: transport.fabric must be a string");
}

TEST(ClusterFileTest, RejectsBadPortsWithFileAndLine) {
  for (const std::string port : {"99999999999999999999999999", "0", "65536", "-1", "80x", ""}) {
    auto c = parse_cluster("[[node]]\nid = 1\ncontrol = \"127.0.0.1:" + port + "\"\n", "c.toml");
    ASSERT_FALSE(c.ok()) << "accepted port '" << port << "'";
    EXPECT_EQ(c.status().code(), ErrorCode::config_error);
    EXPECT_NE(c.status().message().find("c.toml:1: node.control must be \"host:port\""), std::string::npos)
        << c.status().message();
  }
  auto twice = parse_cluster("[[node]]\nid = 1\ncontrol = \"127.0.0.1:7100\"\n[[node]]\nid = 2\ncontrol = \"127.0.0.1:7100\"\n",
                             "c.toml");
  ASSERT_FALSE(twice.ok()) << "two nodes at one address";
  EXPECT_NE(twice.status().message().find("c.toml:4: nodes 1 and 2 have the same control address 127.0.0.1:7100"),
            std::string::npos)
      << twice.status().message();
  auto ok = parse_cluster("[[node]]\nid = 1\ncontrol = \"127.0.0.1:65535\"\n", "c.toml");
  ASSERT_TRUE(ok.ok()) << ok.status().to_string();
  EXPECT_EQ((*ok)[0].control, "127.0.0.1:65535");
}

TEST(ConfigTest, UnreadableFileIsAClearError) {
  auto c = load_config("/nonexistent/tiermemd.toml");
  ASSERT_FALSE(c.ok());
  EXPECT_NE(c.status().message().find("cannot read config file /nonexistent/tiermemd.toml"), std::string::npos);
}

}  // namespace
}  // namespace tiermem

namespace tiermem {
namespace {

// config/tiermemd.toml is the documentation of every key: it must parse, and
// it must mention every key the daemon reads.
TEST(ConfigTest, ShippedExampleIsValidAndDocumentsEveryKey) {
  const std::string path = std::string(TIERMEM_SOURCE_ROOT) + "/config/tiermemd.toml";
  auto c = load_config(path);
  ASSERT_TRUE(c.ok()) << c.status().to_string();
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  const std::string doc = text.str();
  for (const std::string& key : known_config_keys()) {
    const std::string section = "[" + key.substr(0, key.rfind('.')) + "]";
    const std::string name = "\n" + key.substr(key.rfind('.') + 1) + " = ";
    const size_t at = doc.find(section);
    ASSERT_NE(at, std::string::npos) << "section " << section << " is not documented";
    const size_t next = doc.find("\n[", at + 1);
    EXPECT_NE(doc.substr(at, next - at).find(name), std::string::npos) << key << " is not documented";
  }
  EXPECT_GE(known_config_keys().size(), 17u);
}

}  // namespace
}  // namespace tiermem
