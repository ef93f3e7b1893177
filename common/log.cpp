#include "common/log.hpp"

#include <cstdlib>
#include <memory>
#include <string>

#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/sinks/systemd_sink.h>
#include <spdlog/spdlog.h>

namespace tiermem {

Status setup_logging(std::string_view level, std::string_view name) {
  const spdlog::level::level_enum lvl = spdlog::level::from_str(std::string(level));
  // from_str maps anything unknown to "off"; only accept "off" when asked for.
  if (lvl == spdlog::level::off && level != "off") {
    return Status(ErrorCode::invalid_argument,
                  "unknown log level '" + std::string(level) +
                      "' (use trace, debug, info, warn, error, critical or off)");
  }
  // systemd sets JOURNAL_STREAM when stderr is the journal: log there natively
  // (priorities, no duplicate timestamps) instead of formatting text.
  std::shared_ptr<spdlog::logger> logger;
  if (std::getenv("JOURNAL_STREAM") != nullptr) {
    auto sink = std::make_shared<spdlog::sinks::systemd_sink_mt>(std::string(name));
    logger = std::make_shared<spdlog::logger>(std::string(name), std::move(sink));
    logger->set_pattern("%v");
  } else {
    logger = spdlog::stderr_color_mt(std::string(name));
    logger->set_pattern("%Y-%m-%d %H:%M:%S.%e %n[%P] %^%l%$: %v");
  }
  logger->set_level(lvl);
  logger->flush_on(spdlog::level::info);
  spdlog::set_default_logger(std::move(logger));
  return Status();
}

}  // namespace tiermem
