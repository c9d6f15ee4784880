#include "common/status.h"

namespace icecache {

std::string_view StatusCodeName(StatusCode code) {
  switch (code) {
    case StatusCode::kOk: return "OK";
    case StatusCode::kCancelled: return "CANCELLED";
    case StatusCode::kUnknown: return "UNKNOWN";
    case StatusCode::kInvalidArgument: return "INVALID_ARGUMENT";
    case StatusCode::kDeadlineExceeded: return "DEADLINE_EXCEEDED";
    case StatusCode::kNotFound: return "NOT_FOUND";
    case StatusCode::kAlreadyExists: return "ALREADY_EXISTS";
    case StatusCode::kPermissionDenied: return "PERMISSION_DENIED";
    case StatusCode::kResourceExhausted: return "RESOURCE_EXHAUSTED";
    case StatusCode::kFailedPrecondition: return "FAILED_PRECONDITION";
    case StatusCode::kAborted: return "ABORTED";
    case StatusCode::kOutOfRange: return "OUT_OF_RANGE";
    case StatusCode::kUnimplemented: return "UNIMPLEMENTED";
    case StatusCode::kInternal: return "INTERNAL";
    case StatusCode::kUnavailable: return "UNAVAILABLE";
    case StatusCode::kDataLoss: return "DATA_LOSS";
    case StatusCode::kUnauthenticated: return "UNAUTHENTICATED";
  }
  return "UNKNOWN";
}

std::string Status::ToString() const {
  if (ok()) return "OK";
  std::string s(StatusCodeName(code_));
  s += ": ";
  s += message_;
  return s;
}

Status Status::WithContext(std::string_view context) const {
  if (ok()) return *this;
  std::string m(context);
  m += ": ";
  m += message_;
  return Status(code_, std::move(m));
}

#define ICE_DEFINE_ERROR_FACTORY_(Name, Code) \
  Status Name(std::string message) { return Status(StatusCode::Code, std::move(message)); }

ICE_DEFINE_ERROR_FACTORY_(CancelledError, kCancelled)
ICE_DEFINE_ERROR_FACTORY_(UnknownError, kUnknown)
ICE_DEFINE_ERROR_FACTORY_(InvalidArgumentError, kInvalidArgument)
ICE_DEFINE_ERROR_FACTORY_(DeadlineExceededError, kDeadlineExceeded)
ICE_DEFINE_ERROR_FACTORY_(NotFoundError, kNotFound)
ICE_DEFINE_ERROR_FACTORY_(AlreadyExistsError, kAlreadyExists)
ICE_DEFINE_ERROR_FACTORY_(ResourceExhaustedError, kResourceExhausted)
ICE_DEFINE_ERROR_FACTORY_(FailedPreconditionError, kFailedPrecondition)
ICE_DEFINE_ERROR_FACTORY_(AbortedError, kAborted)
ICE_DEFINE_ERROR_FACTORY_(OutOfRangeError, kOutOfRange)
ICE_DEFINE_ERROR_FACTORY_(UnimplementedError, kUnimplemented)
ICE_DEFINE_ERROR_FACTORY_(InternalError, kInternal)
ICE_DEFINE_ERROR_FACTORY_(UnavailableError, kUnavailable)
ICE_DEFINE_ERROR_FACTORY_(DataLossError, kDataLoss)

#undef ICE_DEFINE_ERROR_FACTORY_

}  // namespace icecache
