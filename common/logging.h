// Leveled logging to stderr: ICE_LOG(INFO) << "loaded " << n << " tensors";
// The threshold comes from ICECACHE_LOG_LEVEL (DEBUG, INFO, WARNING, ERROR; default INFO) or
// SetLogLevel(). Thread-safe: each message is written with one write call.
#pragma once

#include <sstream>
#include <string_view>

namespace icecache {

enum class LogLevel : int { kDebug = 0, kInfo = 1, kWarning = 2, kError = 3 };

void SetLogLevel(LogLevel level);
LogLevel GetLogLevel();
// Parses "debug"/"info"/"warning"/"error" (any case). Returns false on an unknown name.
bool ParseLogLevel(std::string_view name, LogLevel* out);

namespace internal {
class LogMessage {
 public:
  LogMessage(LogLevel level, const char* file, int line);
  ~LogMessage();
  std::ostream& stream() { return stream_; }

 private:
  LogLevel level_;
  std::ostringstream stream_;
};
}  // namespace internal

}  // namespace icecache

#define ICE_LOG_LEVEL_DEBUG ::icecache::LogLevel::kDebug
#define ICE_LOG_LEVEL_INFO ::icecache::LogLevel::kInfo
#define ICE_LOG_LEVEL_WARNING ::icecache::LogLevel::kWarning
#define ICE_LOG_LEVEL_ERROR ::icecache::LogLevel::kError

#define ICE_LOG(severity)                                                    \
  if (ICE_LOG_LEVEL_##severity < ::icecache::GetLogLevel()) {                \
  } else                                                                     \
    ::icecache::internal::LogMessage(ICE_LOG_LEVEL_##severity, __FILE__, __LINE__).stream()
