#include "worker/data/criteo.h"

#include <fcntl.h>
#include <unistd.h>

#include <array>
#include <cerrno>
#include <cstring>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "common/hashing.h"
#include "common/log.h"
#include "common/status_macros.h"

namespace recps::worker {
namespace {

constexpr size_t kInitialBuffer = size_t{4} << 20;
// A longer line is reported as bad instead of growing the buffer further.
constexpr size_t kMaxLine = size_t{64} << 20;
constexpr int64_t kLoggedBadLines = 5;

absl::Status OpenError(const std::string& path) {
  const int err = errno;
  return absl::ErrnoToStatus(err, absl::StrCat("cannot open ", path));
}

// Lines of one file at a time through one large reused buffer: a line is a
// view into the buffer, so steady-state reading allocates nothing.
class LineReader {
 public:
  LineReader() : buf_(kInitialBuffer) {}
  ~LineReader() { Close(); }
  LineReader(const LineReader&) = delete;
  LineReader& operator=(const LineReader&) = delete;

  absl::Status Open(const std::string& path) {
    Close();
    fd_ = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd_ < 0) return OpenError(path);
    ::posix_fadvise(fd_, 0, 0, POSIX_FADV_SEQUENTIAL);
    path_ = path;
    begin_ = end_ = 0;
    eof_ = false;
    return absl::OkStatus();
  }

  void Close() {
    if (fd_ >= 0) ::close(fd_);
    fd_ = -1;
  }

  // Sets `line` to the next line without its "\n" or "\r\n"; it stays valid
  // until the next call. Returns false at the end of the file. `overlong`
  // says the line was longer than kMaxLine and `line` holds only its tail.
  absl::StatusOr<bool> NextLine(absl::string_view* line, bool* overlong) {
    *overlong = false;
    size_t scan = begin_;
    while (true) {
      const void* nl = std::memchr(buf_.data() + scan, '\n', end_ - scan);
      if (nl != nullptr) {
        const size_t stop = static_cast<const char*>(nl) - buf_.data();
        *line = Take(stop, stop + 1);
        return true;
      }
      if (eof_) {
        if (begin_ == end_) return false;
        *line = Take(end_, end_);  // a last line without '\n'
        return true;
      }
      // Make room: move the partial line to the front, grow, or drop it.
      if (begin_ > 0) {
        std::memmove(buf_.data(), buf_.data() + begin_, end_ - begin_);
        end_ -= begin_;
        begin_ = 0;
      }
      if (end_ == buf_.size()) {
        if (buf_.size() < kMaxLine) {
          buf_.resize(std::min(2 * buf_.size(), kMaxLine));
        } else {
          *overlong = true;
          end_ = 0;
        }
      }
      scan = end_;
      RETURN_IF_ERROR(Fill());
    }
  }

 private:
  absl::string_view Take(size_t stop, size_t next) {
    absl::string_view line(buf_.data() + begin_, stop - begin_);
    begin_ = next;
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    return line;
  }

  absl::Status Fill() {
    while (true) {
      const ssize_t n = ::read(fd_, buf_.data() + end_, buf_.size() - end_);
      if (n > 0) {
        end_ += static_cast<size_t>(n);
      } else if (n == 0) {
        eof_ = true;
      } else if (errno == EINTR) {
        continue;
      } else {
        const int err = errno;
        return absl::ErrnoToStatus(err, absl::StrCat("cannot read ", path_));
      }
      return absl::OkStatus();
    }
  }

  int fd_ = -1;
  std::string path_;
  std::vector<char> buf_;
  size_t begin_ = 0, end_ = 0;  // unread bytes
  bool eof_ = false;
};

// Each byte's value as a hex digit, 0xff for a byte that is not one. A
// table, not comparisons: in spread 64-bit ids digits and letters come at
// random, and the branches of a comparison chain mispredicted on about
// half the characters (68 ns per 16-digit id, 253 MB/s).
constexpr std::array<uint8_t, 256> MakeHexValues() {
  std::array<uint8_t, 256> t{};
  for (int c = 0; c < 256; ++c) {
    t[c] = c >= '0' && c <= '9'   ? static_cast<uint8_t>(c - '0')
           : c >= 'a' && c <= 'f' ? static_cast<uint8_t>(c - 'a' + 10)
           : c >= 'A' && c <= 'F' ? static_cast<uint8_t>(c - 'A' + 10)
                                  : uint8_t{0xff};
  }
  return t;
}
constexpr std::array<uint8_t, 256> kHexValues = MakeHexValues();

// A field quoted in an error message, cut short.
std::string Quote(absl::string_view field) {
  return absl::StrCat("'", field.substr(0, 24),
                      field.size() > 24 ? "...'" : "'");
}

class CriteoSourceImpl : public CriteoSource {
 public:
  CriteoSourceImpl(const CriteoConfig& config, int rank, int world_size,
                   int64_t batch_size)
      : config_(config),
        rank_(rank),
        world_size_(world_size),
        batch_size_(batch_size) {
    config_.hash_buckets.resize(config_.num_categorical, 0);
  }

  absl::StatusOr<bool> Next(Batch* batch) override {
    if (!error_.ok()) return error_;
    if (done_) return false;
    ResetBatch(config_.num_dense, config_.num_categorical, batch);
    absl::Status status = Fill(batch);
    {
      absl::MutexLock lock(&mu_);
      published_ = local_;
    }
    if (!status.ok()) {
      error_ = status;
      return status;
    }
    if (done_ && local_.bad_lines > 0) {
      LogWarning("criteo: rank ", rank_, " skipped ", local_.bad_lines, " of ",
                 local_.lines, " lines; first: ", local_.first_bad);
    }
    return batch->size > 0;
  }

  CriteoStats stats() const override {
    absl::MutexLock lock(&mu_);
    return published_;
  }

 private:
  // Reads lines until the batch is full or the files end (sets done_).
  absl::Status Fill(Batch* batch) {
    while (batch->size < batch_size_) {
      if (!file_open_) {
        if (file_index_ == config_.paths.size()) {
          done_ = true;
          return absl::OkStatus();
        }
        RETURN_IF_ERROR(reader_.Open(config_.paths[file_index_]));
        file_open_ = true;
        line_in_file_ = 0;
      }
      absl::string_view line;
      bool overlong = false;
      ASSIGN_OR_RETURN(const bool got, reader_.NextLine(&line, &overlong));
      if (!got) {
        reader_.Close();
        file_open_ = false;
        ++file_index_;
        continue;
      }
      ++line_in_file_;
      if (line_number_++ % world_size_ != rank_) continue;
      ++local_.lines;
      const absl::Status parsed = overlong
                                      ? absl::InvalidArgumentError(absl::StrCat(
                                            "longer than ", kMaxLine, " bytes"))
                                      : ParseLine(line, batch);
      if (!parsed.ok()) RecordBad(parsed.message());
    }
    return absl::OkStatus();
  }

  // Appends the line as the batch's next sample, or leaves the batch as it
  // was and says why the line is malformed.
  absl::Status ParseLine(absl::string_view line, Batch* batch) {
    fields_.clear();
    for (size_t start = 0;;) {
      const size_t tab = line.find('\t', start);
      fields_.push_back(
          line.substr(start, tab == line.npos ? line.npos : tab - start));
      if (tab == line.npos) break;
      start = tab + 1;
    }
    const size_t want = 1 + config_.num_dense + config_.num_categorical;
    if (fields_.size() != want) {
      return absl::InvalidArgumentError(
          absl::StrCat("has ", fields_.size(), " fields, want ", want));
    }
    if (fields_[0] != "0" && fields_[0] != "1") {
      return absl::InvalidArgumentError(
          absl::StrCat("label ", Quote(fields_[0]), " is not 0 or 1"));
    }
    absl::Status status = AppendFeatures(batch);
    if (!status.ok()) {
      // Roll back what this line appended.
      batch->dense.resize(batch->size * config_.num_dense);
      for (int f = 0; f < config_.num_categorical; ++f) {
        batch->offsets[f].resize(batch->size + 1);
        batch->ids[f].resize(batch->offsets[f].back());
      }
      return status;
    }
    batch->labels.push_back(fields_[0] == "1" ? 1.0f : 0.0f);
    ++batch->size;
    return absl::OkStatus();
  }

  absl::Status AppendFeatures(Batch* batch) {
    for (int j = 0; j < config_.num_dense; ++j) {
      const absl::string_view field = fields_[1 + j];
      double x = 0;
      int64_t count = 0;
      if (field.empty()) {
        x = 0;
      } else if (absl::SimpleAtoi(field, &count)) {
        x = static_cast<double>(count);
      } else if (!absl::SimpleAtod(field, &x) || !std::isfinite(x)) {
        return absl::InvalidArgumentError(absl::StrCat(
            "dense feature I", j + 1, " ", Quote(field), " is not a number"));
      }
      batch->dense.push_back(CriteoDenseTransform(x));
    }
    for (int f = 0; f < config_.num_categorical; ++f) {
      const absl::string_view field = fields_[1 + config_.num_dense + f];
      std::vector<int64_t>& ids = batch->ids[f];
      const int64_t buckets = config_.hash_buckets[f];
      // Comma-separated tokens of 1 to 16 hex digits, each parsed in the
      // one pass that finds its end.
      const char* p = field.data();
      const char* const end = p + field.size();
      while (p != end) {
        const char* const token = p;
        uint64_t value = 0;
        uint32_t bad = 0;
        for (; p != end && *p != ','; ++p) {
          const uint8_t digit = kHexValues[static_cast<uint8_t>(*p)];
          bad |= digit;
          value = value << 4 | (digit & 0xf);
        }
        const auto length = static_cast<size_t>(p - token);
        // An empty token (",a", "a,,b", "a,") or a bad one: the field.
        if (length == 0 || length > 16 || bad > 0xf || (p != end && p + 1 == end)) {
          return absl::InvalidArgumentError(
              absl::StrCat("categorical feature C", f + 1, " ", Quote(field),
                           " is not hex"));
        }
        ids.push_back(buckets > 0 ? CriteoHashedId(absl::string_view(token, length), buckets)
                                  : static_cast<int64_t>(value));
        if (p != end) ++p;  // the comma
      }
      batch->offsets[f].push_back(static_cast<int64_t>(ids.size()));
    }
    return absl::OkStatus();
  }

  void RecordBad(absl::string_view why) {
    ++local_.bad_lines;
    if (local_.first_bad.empty() || local_.bad_lines <= kLoggedBadLines) {
      const std::string where = absl::StrCat(config_.paths[file_index_], ":",
                                             line_in_file_, ": ", why);
      if (local_.first_bad.empty()) local_.first_bad = where;
      LogWarning("criteo: skipping bad line ", where);
    }
  }

  CriteoConfig config_;
  const int rank_;
  const int world_size_;
  const int64_t batch_size_;
  LineReader reader_;
  size_t file_index_ = 0;
  bool file_open_ = false;
  int64_t line_in_file_ = 0;  // 1-based number of the last line read
  int64_t line_number_ = 0;   // 0-based, across all files: picks the rank
  bool done_ = false;
  absl::Status error_;
  CriteoStats local_;                      // the reading thread's counts
  std::vector<absl::string_view> fields_;  // scratch, reused per line
  mutable absl::Mutex mu_;
  CriteoStats published_ ABSL_GUARDED_BY(mu_);
};

}  // namespace

int64_t CriteoHashedId(absl::string_view hex, int64_t buckets) {
  return static_cast<int64_t>(StableNameKey(hex) %
                              static_cast<uint64_t>(buckets));
}

absl::StatusOr<std::unique_ptr<CriteoSource>> CriteoSource::Create(
    const CriteoConfig& config, int rank, int world_size, int64_t batch_size) {
  if (world_size < 1 || rank < 0 || rank >= world_size || batch_size < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("criteo: bad split rank ", rank, " of ", world_size,
                     ", batch size ", batch_size));
  }
  if (config.paths.empty()) {
    return absl::InvalidArgumentError("criteo: no input paths");
  }
  if (config.num_dense < 0 || config.num_categorical < 0) {
    return absl::InvalidArgumentError("criteo: negative feature count");
  }
  if (!config.hash_buckets.empty() &&
      config.hash_buckets.size() !=
          static_cast<size_t>(config.num_categorical)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "criteo: ", config.hash_buckets.size(), " hash_buckets for ",
        config.num_categorical, " categorical features"));
  }
  for (int64_t buckets : config.hash_buckets) {
    if (buckets < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("criteo: hash_buckets ", buckets, " < 0"));
    }
  }
  // Fail fast on a missing file rather than hours into training.
  for (const std::string& path : config.paths) {
    const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) return OpenError(path);
    ::close(fd);
  }
  return std::unique_ptr<CriteoSource>(
      new CriteoSourceImpl(config, rank, world_size, batch_size));
}

absl::StatusOr<std::unique_ptr<BatchSource>> MakeCriteoSource(
    const CriteoConfig& config, int rank, int world_size, int64_t batch_size) {
  ASSIGN_OR_RETURN(std::unique_ptr<CriteoSource> source,
                   CriteoSource::Create(config, rank, world_size, batch_size));
  return std::unique_ptr<BatchSource>(std::move(source));
}

}  // namespace recps::worker
