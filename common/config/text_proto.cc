#include "common/config/text_proto.h"

#include <fstream>
#include <sstream>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "google/protobuf/io/tokenizer.h"
#include "google/protobuf/text_format.h"

namespace recps {
namespace {

class ErrorCollector : public google::protobuf::io::ErrorCollector {
 public:
  void AddError(int line, google::protobuf::io::ColumnNumber column,
                const std::string& message) override {
    errors.push_back(absl::StrCat("line ", line + 1, " column ", column + 1,
                                  ": ", message));
  }
  std::vector<std::string> errors;
};

}  // namespace

absl::Status ReadTextProto(const std::string& path,
                           google::protobuf::Message* message) {
  std::ifstream in(path);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot open ", path));
  std::stringstream text;
  text << in.rdbuf();
  google::protobuf::TextFormat::Parser parser;
  ErrorCollector errors;
  parser.RecordErrorsTo(&errors);
  if (!parser.ParseFromString(text.str(), message)) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": ", absl::StrJoin(errors.errors, "; ")));
  }
  return absl::OkStatus();
}

}  // namespace recps
