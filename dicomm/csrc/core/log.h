// A tiny logger to stderr; the level comes from DICOMM_LOG_LEVEL=error|warn|info|debug (default warn).
#pragma once

#include <string>

namespace dicomm {

enum class LogLevel { kError = 0, kWarn = 1, kInfo = 2, kDebug = 3 };

bool log_enabled(LogLevel level);
void log(LogLevel level, const std::string& message);

}  // namespace dicomm
