#include "worker/collectives/kv_store.h"

#include <unistd.h>

#include <atomic>
#include <cstdint>
#include <cstdio>
#include <limits>
#include <utility>

#include "absl/container/flat_hash_set.h"
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
                                     absl::Duration poll_interval,
                                     FileSystem* fs)
    : dir_(std::move(dir)), poll_interval_(poll_interval), fs_(fs) {}

absl::StatusOr<std::string> FileKeyValueStore::FileNameFor(
    const std::string& key) {
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
  return name;
}

absl::Status FileKeyValueStore::Set(const std::string& key,
                                    const std::string& value) {
  ASSIGN_OR_RETURN(const std::string name, FileNameFor(key));
  const std::string path = absl::StrCat(dir_, "/", name);
  if (absl::Status s = fs_->CreateDirs(dir_); !s.ok()) {
    return absl::Status(s.code(),
                        absl::StrCat("key-value store: ", s.message()));
  }
  // A name no other writer (thread or process) uses, starting with '.' so
  // that it can never collide with an escaped key.
  static std::atomic<uint64_t> counter{0};
  const std::string tmp = absl::StrCat(dir_, "/.tmp-", getpid(), "-",
                                       counter.fetch_add(1), "-", gettid());
  absl::Status s = fs_->WriteFile(tmp, value, /*sync=*/false);
  if (s.ok()) s = fs_->Rename(tmp, path);
  if (!s.ok()) {
    // A torn or short write leaves part of the value in tmp: never renamed,
    // so readers see no key rather than half of one.
    fs_->RemoveFile(tmp).IgnoreError();
    return absl::Status(
        s.code(), absl::StrCat("key-value store: cannot set key '", key, "' (",
                               path, "): ", s.message()));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::string> FileKeyValueStore::TryRead(
    const std::string& key) const {
  ASSIGN_OR_RETURN(const std::string name, FileNameFor(key));
  // Values are opaque and were never capped: no limit.
  absl::StatusOr<std::string> value = fs_->ReadSmallFile(
      absl::StrCat(dir_, "/", name), std::numeric_limits<int64_t>::max());
  if (absl::IsNotFound(value.status())) return absl::NotFoundError(key);
  if (!value.ok()) {
    return absl::Status(
        value.status().code(),
        absl::StrCat("key-value store: ", value.status().message()));
  }
  return value;
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
  std::vector<std::pair<std::string, std::string>> missing;  // key, file name
  for (const std::string& key : keys) {
    ASSIGN_OR_RETURN(std::string name, FileNameFor(key));
    missing.emplace_back(key, std::move(name));
  }
  while (true) {
    // One listing per round (the seam has no exists()); a key's file
    // appears whole, by rename, or not at all.
    absl::flat_hash_set<std::string> present;
    absl::StatusOr<std::vector<FileSystem::DirEntry>> entries =
        fs_->ListDir(dir_);
    if (entries.ok()) {
      for (FileSystem::DirEntry& e : *entries) {
        present.insert(std::move(e.name));
      }
    } else if (!absl::IsNotFound(entries.status())) {  // NOT_FOUND: no Set yet
      return absl::Status(
          entries.status().code(),
          absl::StrCat("key-value store: ", entries.status().message()));
    }
    std::vector<std::pair<std::string, std::string>> still_missing;
    for (auto& key_name : missing) {
      if (!present.contains(key_name.second)) {
        still_missing.push_back(std::move(key_name));
      }
    }
    missing = std::move(still_missing);
    if (missing.empty()) return absl::OkStatus();
    if (absl::Now() >= deadline) {
      std::vector<std::string> names;
      for (const auto& key_name : missing) names.push_back(key_name.first);
      return MissingKeysError(names, timeout);
    }
    absl::SleepFor(poll_interval_);
  }
}

}  // namespace recps::worker
