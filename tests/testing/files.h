// Small file helpers for tests (one copy each).
#ifndef RECPS_TESTS_TESTING_FILES_H_
#define RECPS_TESTS_TESTING_FILES_H_

#include <stdlib.h>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

namespace recps::testing {

// The whole file at `path` ("" when it cannot be read).
inline std::string ReadAll(const std::string& path) {
  std::stringstream text;
  text << std::ifstream(path, std::ios::binary).rdbuf();
  return text.str();
}

// A temporary directory, removed with its files when destroyed.
class TempDir {
 public:
  TempDir() {
    std::string tmpl = (std::filesystem::temp_directory_path() / "recps-XXXXXX").string();
    char* made = mkdtemp(tmpl.data());
    path_ = made != nullptr ? made : "/tmp";
  }
  ~TempDir() {
    std::error_code ec;
    if (path_ != "/tmp") std::filesystem::remove_all(path_, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const std::string& path() const { return path_; }
  // Writes `contents` to path()/name and returns the full path.
  std::string WriteFile(const std::string& name, const std::string& contents) const {
    const std::string full = path_ + "/" + name;
    std::ofstream(full) << contents;
    return full;
  }

 private:
  std::string path_;
};

}  // namespace recps::testing

#endif  // RECPS_TESTS_TESTING_FILES_H_
