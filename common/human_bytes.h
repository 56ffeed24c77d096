// Byte counts for people: "512 B", "1.50 KiB", "256.00 MiB", "3.25 GiB".
// One format for every message, plan table and CLI report.
#ifndef RECPS_COMMON_HUMAN_BYTES_H_
#define RECPS_COMMON_HUMAN_BYTES_H_

#include <cmath>
#include <string>

#include "absl/strings/str_format.h"

namespace recps {

inline std::string HumanBytes(double bytes) {
  static constexpr const char* kUnits[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB"};
  int unit = 0;
  while (std::abs(bytes) >= 1024 && unit < 5) {
    bytes /= 1024;
    ++unit;
  }
  return unit == 0 ? absl::StrFormat("%.0f B", bytes)
                   : absl::StrFormat("%.2f %s", bytes, kUnits[unit]);
}

}  // namespace recps

#endif  // RECPS_COMMON_HUMAN_BYTES_H_
