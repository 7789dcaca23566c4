#include "core/log.h"

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <unistd.h>

#include "core/config.h"

namespace dicomm {
namespace {

LogLevel level_from_env() {
  std::string v;
  try {
    v = config::choice("DICOMM_LOG_LEVEL");
  } catch (const std::exception&) {
    return LogLevel::kWarn;  // logging never fails; creating a communicator reports the bad value
  }
  if (v == "error") return LogLevel::kError;
  if (v == "info") return LogLevel::kInfo;
  if (v == "debug") return LogLevel::kDebug;
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
