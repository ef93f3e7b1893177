// Starts a real tiermemd for a test: a temporary directory holds its config,
// socket and PMEM pool; the process is stopped (SIGTERM, then SIGKILL) when
// the object goes away. Paths of the binaries come from the environment that
// meson test sets (TIERMEMD, TIERMEMCTL).
#pragma once

#include <sys/types.h>

#include <string>
#include <vector>

#include <tiermem/client.h>

namespace tiermem::test {

struct DaemonOptions {
  int node_id = 1;
  std::string dram = "64MiB";
  std::string pmem = "64MiB";
  std::string page_size = "2MiB";
  std::string max_frame = "4MiB";
  std::string max_inline = "1MiB";
  bool vram = false;
  std::string vram_capacity = "256MiB";
  std::string extra_toml;  // appended verbatim
};

class TestDaemon {
 public:
  explicit TestDaemon(const DaemonOptions& options = {});
  ~TestDaemon();
  TestDaemon(const TestDaemon&) = delete;
  TestDaemon& operator=(const TestDaemon&) = delete;

  // True once the daemon answers on its socket (waits up to 10 s).
  bool ready() const { return m_ready; }
  const std::string& socket() const { return m_socket; }
  const std::string& dir() const { return m_dir; }
  const std::string& log_path() const { return m_log; }
  std::string log() const;
  pid_t pid() const { return m_pid; }
  // True while the process has not exited.
  bool alive();

  std::unique_ptr<Client> connect(const std::string& name = "test") const;
  // Sends SIGTERM and waits; returns the exit status (or -1).
  int stop();

 private:
  std::string m_dir;
  std::string m_socket;
  std::string m_log;
  pid_t m_pid = -1;
  bool m_ready = false;
};

struct CommandResult {
  int exit_code = -1;
  std::string out;
  std::string err;
};

// Runs a program with arguments, feeding `input` on stdin; captures output.
CommandResult run_command(const std::vector<std::string>& argv, const std::string& input = "");
// Runs tiermemctl against `socket`.
CommandResult run_ctl(const std::string& socket, const std::vector<std::string>& args,
                      const std::string& input = "");

std::string tiermemd_path();
std::string tiermemctl_path();
// A fresh directory under $TMPDIR (or /tmp), removed by the caller if wanted.
std::string make_temp_dir(const std::string& prefix);

}  // namespace tiermem::test
