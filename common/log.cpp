#include "common/log.hpp"

#include <sys/stat.h>
#include <unistd.h>

#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>

#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/sinks/systemd_sink.h>
#include <spdlog/spdlog.h>

namespace tiermem {

namespace {

Result<spdlog::level::level_enum> parse_level(std::string_view level) {
  const spdlog::level::level_enum lvl = spdlog::level::from_str(std::string(level));
  // from_str maps anything unknown to "off"; only accept "off" when asked for.
  if (lvl == spdlog::level::off && level != "off") {
    return Status(ErrorCode::invalid_argument,
                  "unknown log level '" + std::string(level) +
                      "' (use trace, debug, info, warn, error, critical or off)");
  }
  return lvl;
}

}  // namespace

bool stderr_is_journal() {
  const char* stream = std::getenv("JOURNAL_STREAM");
  if (stream == nullptr) return false;
  uintmax_t device = 0, inode = 0;
  if (std::sscanf(stream, "%" SCNuMAX ":%" SCNuMAX, &device, &inode) != 2) return false;
  struct stat st {};
  if (::fstat(STDERR_FILENO, &st) != 0) return false;
  return static_cast<uintmax_t>(st.st_dev) == device && static_cast<uintmax_t>(st.st_ino) == inode;
}

Status setup_logging(std::string_view level, std::string_view name) {
  auto lvl = parse_level(level);
  if (!lvl.ok()) return lvl.status();
  // When stderr is the journal, log there natively (priorities, no
  // duplicate timestamps) instead of formatting text.
  std::shared_ptr<spdlog::logger> logger;
  if (stderr_is_journal()) {
    auto sink = std::make_shared<spdlog::sinks::systemd_sink_mt>(std::string(name));
    logger = std::make_shared<spdlog::logger>(std::string(name), std::move(sink));
    logger->set_pattern("%v");
  } else {
    logger = spdlog::stderr_color_mt(std::string(name));
    logger->set_pattern("%Y-%m-%d %H:%M:%S.%e %n[%P] %^%l%$: %v");
  }
  logger->set_level(*lvl);
  logger->flush_on(spdlog::level::info);
  spdlog::set_default_logger(std::move(logger));
  return Status();
}

Status set_log_level(std::string_view level) {
  auto lvl = parse_level(level);
  if (!lvl.ok()) return lvl.status();
  spdlog::default_logger()->set_level(*lvl);
  return Status();
}

}  // namespace tiermem
