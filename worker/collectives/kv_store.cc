#include "worker/collectives/kv_store.h"

#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/status_macros.h"

namespace recps::worker {
namespace {

absl::Status MissingKeysError(const std::vector<std::string>& missing,
                              absl::Duration timeout) {
  return absl::DeadlineExceededError(
      absl::StrCat("key-value store: key", missing.size() == 1 ? " '" : "s '",
                   absl::StrJoin(missing, "', '"), "' not set within ",
                   absl::FormatDuration(timeout)));
}

}  // namespace

// ---------------------------------------------------------------- in memory

absl::Status InMemoryKeyValueStore::Set(const std::string& key,
                                        const std::string& value) {
  absl::MutexLock lock(&mu_);
  values_[key] = value;
  return absl::OkStatus();
}

absl::StatusOr<std::string> InMemoryKeyValueStore::Get(const std::string& key,
                                                       absl::Duration timeout) {
  RETURN_IF_ERROR(Wait({key}, timeout));
  absl::MutexLock lock(&mu_);
  return values_.at(key);
}

absl::Status InMemoryKeyValueStore::Wait(const std::vector<std::string>& keys,
                                         absl::Duration timeout) {
  auto all_present = [this, &keys]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    for (const std::string& key : keys) {
      if (!values_.contains(key)) return false;
    }
    return true;
  };
  absl::MutexLock lock(&mu_);
  if (mu_.AwaitWithTimeout(absl::Condition(&all_present), timeout)) {
    return absl::OkStatus();
  }
  std::vector<std::string> missing;
  for (const std::string& key : keys) {
    if (!values_.contains(key)) missing.push_back(key);
  }
  return MissingKeysError(missing, timeout);
}

// -------------------------------------------------------------------- files

FileKeyValueStore::FileKeyValueStore(std::string dir,
                                     absl::Duration poll_interval)
    : dir_(std::move(dir)), poll_interval_(poll_interval) {}

absl::StatusOr<std::string> FileKeyValueStore::PathFor(
    const std::string& key) const {
  // Keys hold '/' and ':' (prefixes); escape everything outside a safe set,
  // '.' included, so no key names a hidden temporary file or "..".
  std::string name;
  for (unsigned char c : key) {
    if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
        (c >= '0' && c <= '9') || c == '_' || c == '-') {
      name.push_back(static_cast<char>(c));
    } else {
      char hex[4];
      std::snprintf(hex, sizeof(hex), "%%%02X", c);
      name += hex;
    }
  }
  if (name.empty() || name.size() > 240) {
    return absl::InvalidArgumentError(
        absl::StrCat("key-value store: key '", key,
                     "' is empty or too long for a file name"));
  }
  return absl::StrCat(dir_, "/", name);
}

absl::Status FileKeyValueStore::Set(const std::string& key,
                                    const std::string& value) {
  absl::StatusOr<std::string> path = PathFor(key);
  if (!path.ok()) return path.status();
  std::error_code ec;
  std::filesystem::create_directories(dir_, ec);
  if (ec) {
    return absl::UnavailableError(absl::StrCat(
        "key-value store: cannot create ", dir_, ": ", ec.message()));
  }
  // A name no other writer (thread or process) uses, starting with '.' so
  // that it can never collide with an escaped key.
  static std::atomic<uint64_t> counter{0};
  const std::string tmp = absl::StrCat(dir_, "/.tmp-", getpid(), "-",
                                       counter.fetch_add(1), "-", gettid());
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    out.write(value.data(), static_cast<std::streamsize>(value.size()));
    out.close();
    if (!out) {
      std::remove(tmp.c_str());
      return absl::UnavailableError(
          absl::StrCat("key-value store: cannot write ", tmp));
    }
  }
  if (std::rename(tmp.c_str(), path->c_str()) != 0) {
    const int err = errno;
    std::remove(tmp.c_str());
    return absl::UnavailableError(
        absl::StrCat("key-value store: cannot rename ", tmp, " to ", *path,
                     ": ", std::strerror(err)));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::string> FileKeyValueStore::TryRead(
    const std::string& key) const {
  absl::StatusOr<std::string> path = PathFor(key);
  if (!path.ok()) return path.status();
  std::ifstream in(*path, std::ios::binary);
  if (!in) return absl::NotFoundError(key);
  std::ostringstream contents;
  contents << in.rdbuf();
  if (in.bad()) {
    return absl::UnavailableError(
        absl::StrCat("key-value store: cannot read ", *path));
  }
  return contents.str();
}

absl::StatusOr<std::string> FileKeyValueStore::Get(const std::string& key,
                                                   absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  while (true) {
    absl::StatusOr<std::string> value = TryRead(key);
    if (!absl::IsNotFound(value.status())) return value;
    if (absl::Now() >= deadline) return MissingKeysError({key}, timeout);
    absl::SleepFor(poll_interval_);
  }
}

absl::Status FileKeyValueStore::Wait(const std::vector<std::string>& keys,
                                     absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  std::vector<std::string> missing = keys;
  while (true) {
    std::vector<std::string> still_missing;
    for (const std::string& key : missing) {
      absl::StatusOr<std::string> path = PathFor(key);
      if (!path.ok()) return path.status();
      std::error_code ec;
      if (!std::filesystem::exists(*path, ec)) still_missing.push_back(key);
    }
    missing = std::move(still_missing);
    if (missing.empty()) return absl::OkStatus();
    if (absl::Now() >= deadline) return MissingKeysError(missing, timeout);
    absl::SleepFor(poll_interval_);
  }
}

}  // namespace recps::worker
