// Per-context counters that other processes can read (the `softrdma stats` CLI). Each context maps
// /dev/shm/softrdma.<devname>.<pid>.<seq>: a header, a Counters block of relaxed atomics that the context
// updates in place, and the counter names. The totals of a device are the sum over its files plus
// /dev/shm/softrdma.<devname>.retired, into which the garbage collector (run by create) folds the files of
// dead processes, so totals stay cumulative. Files of processes that exited stay until then.
//
// The file is an ABI between builds (like libfabric's shm segment): magic, version, offsets rather than
// pointers, and the counter names, so a reader adds counters by name and a build with a longer or reordered
// counter list still reads and folds files of another. The retired file's flock orders the garbage
// collector (exclusive), reset (exclusive) and sum (shared).
#pragma once

#include <array>
#include <atomic>
#include <cstdint>
#include <expected>
#include <memory>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

#include "core/counters.h"

namespace softrdma::io {

class StatsRegion {
 public:
  static constexpr uint64_t kMagic = 0x5354415453524453ull;  // "SDRSTATS" as little-endian bytes
  static constexpr uint32_t kVersion = 1;
  static constexpr const char* kShmDir = "/dev/shm";
  static constexpr std::string_view kFilePrefix = "softrdma.";
  static constexpr std::string_view kRetiredSuffix = "retired";
  static constexpr size_t kMaxDeviceName = 63;
  static constexpr uint32_t kNameLen = 32;  // bytes per counter name in the file, NUL included

  struct Header {
    uint64_t magic;  // stored last (release), checked first (acquire)
    uint32_t version;
    uint32_t num_counters;     // of the writer's build
    uint32_t counters_offset;  // uint64_t[num_counters], 64-byte aligned
    uint32_t names_offset;     // char[num_counters][name_len]
    uint32_t name_len;
    int32_t pid;          // 0 for the retired file
    uint64_t start_time;  // the writer's start time (/proc/<pid>/stat field 22), to tell pid reuse apart
    uint32_t closed;      // 1 once its context closed it cleanly (informational)
    uint32_t reserved;
    char device[kMaxDeviceName + 1];
  };
  static constexpr uint32_t kCountersOffset = 256;
  static constexpr uint32_t kNamesOffset = kCountersOffset + sizeof(Counters);
  static constexpr size_t kFileSize = kNamesOffset + size_t{kNumCounters} * kNameLen;
  static_assert(sizeof(Header) <= kCountersOffset);
  static_assert(std::atomic<uint64_t>::is_always_lock_free, "counters are shared between processes");
  static_assert(std::is_standard_layout_v<Counters> && sizeof(Counters) == kNumCounters * sizeof(uint64_t));

  // Garbage-collects the device's dead files, then creates this context's file. errno on failure.
  static std::expected<std::unique_ptr<StatsRegion>, int> create(std::string_view devname);
  ~StatsRegion();  // marks the file closed and unmaps it; the file stays until a later GC folds it
  StatsRegion(const StatsRegion&) = delete;
  StatsRegion& operator=(const StatsRegion&) = delete;

  Counters* counters() { return counters_; }
  const std::string& path() const { return path_; }

  // Totals of a device over all its files, the retired one included. Zeros when there are none. With a
  // `pid`, only that process's own files (the retired one left out).
  static std::array<uint64_t, kNumCounters> sum(std::string_view devname, int pid = 0);
  // Zeroes every counter of the device, live files included (atomic stores, so later increments count).
  static void reset(std::string_view devname);
  // Folds the files of dead processes into the retired file and unlinks them; returns how many.
  static int collect_garbage(std::string_view devname);
  // Device names that have files in kShmDir, sorted.
  static std::vector<std::string> devices_with_files();
  // Unlinks every file of a device, the retired one included (tests, cleanup).
  static void remove_all(std::string_view devname);

 private:
  StatsRegion(std::string path, void* map, Counters* counters)
      : path_(std::move(path)), map_(map), counters_(counters) {}

  std::string path_;
  void* map_ = nullptr;
  Counters* counters_ = nullptr;
};

}  // namespace softrdma::io
