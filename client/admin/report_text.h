// How recpsctl prints its reports: aligned plain-text tables for people,
// JSON (the proto3 mapping of the recps.v1 admin messages) for scripts.
#ifndef RECPS_CLIENT_ADMIN_REPORT_TEXT_H_
#define RECPS_CLIENT_ADMIN_REPORT_TEXT_H_

#include <cstdint>
#include <ostream>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/human_bytes.h"
#include "google/protobuf/message.h"
#include "recps/v1/admin.pb.h"

namespace recps::client::admin {

// Columns separated by two spaces; a column whose cells are all numbers
// (or "-") is right-aligned.
class TextTable {
 public:
  explicit TextTable(std::vector<std::string> header);
  // REQUIRES: as many cells as the header has.
  void AddRow(std::vector<std::string> cells);
  std::string Render() const;

 private:
  std::vector<std::vector<std::string>> rows_;  // the header first
};

std::string FormatClusterStatus(const v1::ClusterStatus& status);
std::string FormatTablesReport(const v1::TablesReport& report);
std::string FormatShardsReport(const v1::ShardsReport& report, bool per_slot);

// Pretty-printed JSON with every field present and proto field names.
absl::StatusOr<std::string> ToJson(const google::protobuf::Message& message);
// Writes ToJson(message) and a newline to `out` (0), or the error to `err`
// (1): a command's --json output and its exit code.
int PrintJson(const google::protobuf::Message& message, std::ostream& out, std::ostream& err);

}  // namespace recps::client::admin

#endif  // RECPS_CLIENT_ADMIN_REPORT_TEXT_H_
