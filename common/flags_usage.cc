#include "common/flags_usage.h"

#include <string>

#include "absl/flags/usage_config.h"
#include "absl/strings/match.h"
#include "absl/strings/string_view.h"
#include "absl/strings/strip.h"

namespace recps {
namespace {

absl::string_view Basename(absl::string_view path) {
  const size_t slash = path.rfind('/');
  return slash == absl::string_view::npos ? path : path.substr(slash + 1);
}

// "../../server/shard/shard_main.cc" -> "server/shard/shard_main.cc".
std::string Normalize(absl::string_view path) {
  while (absl::ConsumePrefix(&path, "../") || absl::ConsumePrefix(&path, "./")) {
  }
  return std::string(path);
}

}  // namespace

void SetFlagsUsageFromMainFile(const char* main_file) {
  // By base name: the filter sees names after normalize_filename, and a
  // binary's flags are defined in its main file or in files named
  // *_flags.cc (libraries take options structs): tls_flags.cc and
  // gate_flags.cc, the transport-security and per-client limit flags the
  // daemons share, and a binary's own, e.g. worker_flags.cc.
  const std::string main_base(Basename(main_file));
  auto is_main = [main_base](absl::string_view file) {
    const absl::string_view base = Basename(file);
    return base == main_base || absl::EndsWith(base, "_flags.cc");
  };
  absl::FlagsUsageConfig config;
  config.contains_help_flags = is_main;
  config.contains_helpshort_flags = is_main;
  config.contains_helppackage_flags = is_main;
  config.normalize_filename = Normalize;
  absl::SetFlagsUsageConfig(config);
}

}  // namespace recps
