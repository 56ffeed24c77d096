// --help for the recps binaries: lists the flags of the binary's own main
// file (absl's default only matches a file named after the program, so
// `recps-shard --help` said "No flags matched").
#ifndef RECPS_COMMON_FLAGS_USAGE_H_
#define RECPS_COMMON_FLAGS_USAGE_H_

namespace recps {

// Call first thing in main(), before absl::ParseCommandLine, with __FILE__:
// --help and --helpshort then list the flags defined in that file;
// --helpfull still lists every flag. File names print without the leading
// "../" of an out-of-tree build.
void SetFlagsUsageFromMainFile(const char* main_file);

}  // namespace recps

#endif  // RECPS_COMMON_FLAGS_USAGE_H_
