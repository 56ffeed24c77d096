// Reads text-format protobuf files (configs), with errors that name the file,
// line and column.
#ifndef RECPS_COMMON_CONFIG_TEXT_PROTO_H_
#define RECPS_COMMON_CONFIG_TEXT_PROTO_H_

#include <string>

#include "absl/status/status.h"
#include "google/protobuf/message.h"

namespace recps {

// NOT_FOUND when the file cannot be opened; INVALID_ARGUMENT with every
// parse error ("path: line 3 column 5: ...") when it does not parse.
absl::Status ReadTextProto(const std::string& path,
                           google::protobuf::Message* message);

}  // namespace recps

#endif  // RECPS_COMMON_CONFIG_TEXT_PROTO_H_
