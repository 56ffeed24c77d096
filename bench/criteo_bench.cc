// The Criteo TSV reader (worker/data/criteo.h) against the floor of its
// input: a scan of the same bytes for line ends (memchr), measured in the
// same run on the file in the page cache.
//
// Writes a file of multi-hot lines like the peer panel's Z-var-dyn and
// U-var shapes (label, 13 dense counts, 26 bags of 1..15 ids of 16 hex
// digits: spread 63-bit ids), reads it whole as one worker (W1) batch by
// batch, and prints MB/s, ns per id and the ratio to the scan.
//
//   recps_criteo_bench [--lines=200000] [--rounds=5]
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "worker/data/criteo.h"

namespace recps::worker {
namespace {

double Now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

int Main(int argc, char** argv) {
  int64_t lines = 200000;
  int rounds = 5;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a.rfind("--lines=", 0) == 0) lines = std::stoll(a.substr(8));
    if (a.rfind("--rounds=", 0) == 0) rounds = std::stoi(a.substr(9));
  }
  const std::string path = absl::StrCat("/tmp/recps_criteo_bench.", getpid(), ".tsv");
  int64_t ids = 0;
  {
    std::mt19937_64 rng(1);
    std::ofstream out(path);
    char hex[17];
    std::string line;
    for (int64_t l = 0; l < lines; ++l) {
      line.clear();
      line += (rng() & 1) ? '1' : '0';
      for (int d = 0; d < 13; ++d) absl::StrAppend(&line, "\t", rng() % 1000);
      for (int f = 0; f < 26; ++f) {
        line += '\t';
        const int n = 1 + static_cast<int>(rng() % 15);
        for (int k = 0; k < n; ++k) {
          std::snprintf(hex, sizeof(hex), "%016llx",
                        static_cast<unsigned long long>(rng() >> 1));
          if (k > 0) line += ',';
          line += hex;
        }
        ids += n;
      }
      line += '\n';
      out << line;
    }
  }
  std::ifstream in(path, std::ios::binary);
  const std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::vector<double> scan, read;
  for (int r = 0; r < rounds; ++r) {
    double t = Now();
    int64_t ends = 0;
    for (const char* p = bytes.data(); (p = static_cast<const char*>(std::memchr(
                                            p, '\n', bytes.data() + bytes.size() - p)));
         ++p) {
      ++ends;
    }
    scan.push_back(Now() - t);
    if (ends != lines) std::fprintf(stderr, "scan found %lld lines\n", static_cast<long long>(ends));
    CriteoConfig config;
    config.paths = {path};
    auto source = CriteoSource::Create(config, 0, 1, 4096);
    if (!source.ok()) {
      std::fprintf(stderr, "%s\n", source.status().ToString().c_str());
      return 1;
    }
    Batch batch;
    int64_t got = 0;
    t = Now();
    for (;;) {
      auto more = (*source)->Next(&batch);
      if (!more.ok() || !*more) break;
      got += batch.size;
    }
    read.push_back(Now() - t);
    if (got != lines || (*source)->stats().bad_lines != 0) {
      std::fprintf(stderr, "read %lld lines, %lld bad\n", static_cast<long long>(got),
                   static_cast<long long>((*source)->stats().bad_lines));
      return 1;
    }
  }
  unlink(path.c_str());
  const double mb = static_cast<double>(bytes.size()) / 1e6;
  std::printf("file: %lld lines, %.1f MB, %lld ids (mean %.1f per bag)\n",
              static_cast<long long>(lines), mb, static_cast<long long>(ids),
              static_cast<double>(ids) / static_cast<double>(lines * 26));
  std::printf("scan (memchr, the anchor): %.0f MB/s\n", mb / Median(scan));
  std::printf("CriteoSource W1:           %.0f MB/s, %.1f ns per id, %.3fx the scan\n",
              mb / Median(read), 1e9 * Median(read) / static_cast<double>(ids),
              Median(scan) / Median(read));
  return 0;
}

}  // namespace
}  // namespace recps::worker

int main(int argc, char** argv) { return recps::worker::Main(argc, argv); }
