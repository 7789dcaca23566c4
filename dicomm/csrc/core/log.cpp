#include "core/log.h"

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <unistd.h>

namespace dicomm {
namespace {

LogLevel level_from_env() {
  const char* v = std::getenv("DICOMM_LOG_LEVEL");
  if (!v) return LogLevel::kWarn;
  if (!strcasecmp(v, "error")) return LogLevel::kError;
  if (!strcasecmp(v, "info")) return LogLevel::kInfo;
  if (!strcasecmp(v, "debug")) return LogLevel::kDebug;
  return LogLevel::kWarn;
}

const char* level_name(LogLevel l) {
  switch (l) {
    case LogLevel::kError: return "ERROR";
    case LogLevel::kWarn: return "WARN";
    case LogLevel::kInfo: return "INFO";
    default: return "DEBUG";
  }
}

}  // namespace

bool log_enabled(LogLevel level) {
  static const LogLevel threshold = level_from_env();
  return level <= threshold;
}

void log(LogLevel level, const std::string& message) {
  if (!log_enabled(level)) return;
  // One fprintf per line keeps lines of different processes from interleaving mid-line.
  std::fprintf(stderr, "[dicomm %s pid %d] %s\n", level_name(level), static_cast<int>(getpid()),
               message.c_str());
}

}  // namespace dicomm
