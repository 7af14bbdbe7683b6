#include "io/stats_shm.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <string>

namespace softrdma::io {
namespace {

constexpr uint32_t idx(Counter c) { return static_cast<uint32_t>(c); }

bool exists(const std::string& path) {
  struct stat st;
  return stat(path.c_str(), &st) == 0;
}

// Each test works on a device name of its own, removed before and after.
class StatsShmTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dev_ = "sr_iotest_" + std::to_string(getpid()) + "_" +
           ::testing::UnitTest::GetInstance()->current_test_info()->name();
    dev_.resize(std::min(dev_.size(), StatsRegion::kMaxDeviceName));
    StatsRegion::remove_all(dev_);
  }
  void TearDown() override { StatsRegion::remove_all(dev_); }

  std::unique_ptr<StatsRegion> create() {
    auto r = StatsRegion::create(dev_);
    EXPECT_TRUE(r.has_value()) << std::strerror(r.error());
    return r ? std::move(*r) : nullptr;
  }

  // Runs `body` in a child process that then _exit()s (no destructors, like a crash); returns its pid.
  template <typename F>
  pid_t in_child(F body) {
    const pid_t pid = fork();
    if (pid == 0) {
      body();
      _exit(0);
    }
    int status = 0;
    EXPECT_EQ(waitpid(pid, &status, 0), pid);
    EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    return pid;
  }

  std::string dev_;
};

TEST_F(StatsShmTest, CreateSumReset) {
  for (uint64_t v : StatsRegion::sum(dev_)) EXPECT_EQ(v, 0u);
  auto r1 = create();
  auto r2 = create();
  ASSERT_TRUE(r1 && r2);
  EXPECT_NE(r1->path(), r2->path());
  EXPECT_TRUE(exists(r1->path()));
  EXPECT_EQ(r1->path().rfind("/dev/shm/softrdma." + dev_ + "." + std::to_string(getpid()) + ".", 0), 0u);

  r1->counters()->add(Counter::tx_packets, 5);
  r2->counters()->add(Counter::tx_packets, 7);
  r2->counters()->add(Counter::drop_bad_icrc, 2);
  r2->counters()->add(Counter::drop_injected);
  auto s = StatsRegion::sum(dev_);
  for (uint32_t i = 0; i < kNumCounters; ++i) {
    uint64_t want = 0;
    if (i == idx(Counter::tx_packets)) want = 12;
    if (i == idx(Counter::drop_bad_icrc)) want = 2;
    if (i == idx(Counter::drop_injected)) want = 1;
    EXPECT_EQ(s[i], want) << kCounterInfo[i].name;
  }
  // Other devices are not mixed in.
  EXPECT_EQ(StatsRegion::sum(dev_ + "x")[idx(Counter::tx_packets)], 0u);
  const auto devs = StatsRegion::devices_with_files();
  EXPECT_TRUE(std::find(devs.begin(), devs.end(), dev_) != devs.end());

  StatsRegion::reset(dev_);
  for (uint64_t v : StatsRegion::sum(dev_)) EXPECT_EQ(v, 0u);
  EXPECT_EQ(r2->counters()->get(Counter::tx_packets), 0u);  // live blocks are zeroed in place
  r1->counters()->add(Counter::rx_packets, 3);
  EXPECT_EQ(StatsRegion::sum(dev_)[idx(Counter::rx_packets)], 3u);
}

TEST_F(StatsShmTest, HeaderDescribesTheFile) {
  auto r = create();
  ASSERT_TRUE(r);
  const int fd = open(r->path().c_str(), O_RDONLY);
  ASSERT_GE(fd, 0);
  struct stat st;
  ASSERT_EQ(fstat(fd, &st), 0);
  EXPECT_EQ(static_cast<size_t>(st.st_size), StatsRegion::kFileSize);
  StatsRegion::Header h;
  ASSERT_EQ(pread(fd, &h, sizeof h, 0), static_cast<ssize_t>(sizeof h));
  close(fd);
  EXPECT_EQ(h.magic, StatsRegion::kMagic);
  EXPECT_EQ(h.version, StatsRegion::kVersion);
  EXPECT_EQ(h.pid, getpid());
  EXPECT_EQ(h.num_counters, kNumCounters);
  EXPECT_EQ(std::string(h.device), dev_);
  EXPECT_NE(h.start_time, 0u);
  EXPECT_EQ(h.closed, 0u);
}

TEST_F(StatsShmTest, DeadProcessIsFoldedIntoRetired) {
  auto mine = create();
  ASSERT_TRUE(mine);
  mine->counters()->add(Counter::rx_packets, 1);

  int pipefd[2];
  ASSERT_EQ(pipe(pipefd), 0);
  in_child([&] {
    auto r = StatsRegion::create(dev_);
    if (!r) _exit(1);
    (*r)->counters()->add(Counter::tx_packets, 100);
    (*r)->counters()->add(Counter::rx_bytes, 12345);
    const std::string& p = (*r)->path();
    if (write(pipefd[1], p.data(), p.size()) != static_cast<ssize_t>(p.size())) _exit(1);
    _exit(0);  // no destructor: as if it crashed
  });
  close(pipefd[1]);
  char buf[256] = {};
  ASSERT_GT(read(pipefd[0], buf, sizeof buf - 1), 0);
  close(pipefd[0]);
  const std::string child_path(buf);
  ASSERT_TRUE(exists(child_path));

  // The dead child's file still counts before any GC.
  auto s = StatsRegion::sum(dev_);
  EXPECT_EQ(s[idx(Counter::tx_packets)], 100u);
  EXPECT_EQ(s[idx(Counter::rx_bytes)], 12345u);
  EXPECT_EQ(s[idx(Counter::rx_packets)], 1u);
  // One process's own files (softrdma stats --pid).
  const std::string prefix = "/dev/shm/softrdma." + dev_ + ".";
  const int child_pid = std::stoi(child_path.substr(prefix.size()));
  EXPECT_EQ(StatsRegion::sum(dev_, child_pid)[idx(Counter::tx_packets)], 100u);
  EXPECT_EQ(StatsRegion::sum(dev_, child_pid)[idx(Counter::rx_packets)], 0u);
  EXPECT_EQ(StatsRegion::sum(dev_, getpid())[idx(Counter::tx_packets)], 0u);
  EXPECT_EQ(StatsRegion::sum(dev_, getpid())[idx(Counter::rx_packets)], 1u);

  // A new region runs the GC: the child's file is folded and removed; ours (alive) is not.
  auto next = create();
  ASSERT_TRUE(next);
  EXPECT_FALSE(exists(child_path));
  EXPECT_TRUE(exists(mine->path()));
  EXPECT_TRUE(exists("/dev/shm/softrdma." + dev_ + ".retired"));
  s = StatsRegion::sum(dev_);
  EXPECT_EQ(s[idx(Counter::tx_packets)], 100u);
  EXPECT_EQ(s[idx(Counter::rx_bytes)], 12345u);
  EXPECT_EQ(s[idx(Counter::rx_packets)], 1u);
  EXPECT_EQ(StatsRegion::sum(dev_, child_pid)[idx(Counter::tx_packets)], 0u);  // retired: no process's
  EXPECT_EQ(StatsRegion::collect_garbage(dev_), 0);

  // Totals stay cumulative across more deaths, and reset clears the retired part too.
  in_child([&] {
    auto r = StatsRegion::create(dev_);
    if (!r) _exit(1);
    (*r)->counters()->add(Counter::tx_packets, 11);
    r->reset();  // a clean exit: the file stays, marked closed
    _exit(0);
  });
  EXPECT_EQ(StatsRegion::sum(dev_)[idx(Counter::tx_packets)], 111u);
  EXPECT_EQ(StatsRegion::collect_garbage(dev_), 1);
  EXPECT_EQ(StatsRegion::sum(dev_)[idx(Counter::tx_packets)], 111u);
  StatsRegion::reset(dev_);
  EXPECT_EQ(StatsRegion::sum(dev_)[idx(Counter::tx_packets)], 0u);
}

TEST_F(StatsShmTest, ReusedPidIsTreatedAsDead) {
  auto r = create();
  ASSERT_TRUE(r);
  r->counters()->add(Counter::retransmits, 4);
  // Pretend the file is from an earlier process that had our pid: its start time differs from ours.
  const int fd = open(r->path().c_str(), O_RDWR);
  ASSERT_GE(fd, 0);
  auto* h = static_cast<StatsRegion::Header*>(
      mmap(nullptr, sizeof(StatsRegion::Header), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0));
  close(fd);
  ASSERT_NE(h, MAP_FAILED);
  h->start_time += 1;
  munmap(h, sizeof(StatsRegion::Header));
  EXPECT_EQ(StatsRegion::collect_garbage(dev_), 1);
  EXPECT_FALSE(exists(r->path()));
  EXPECT_EQ(StatsRegion::sum(dev_)[idx(Counter::retransmits)], 4u);
}

// A file written by a build with another counter list is read by name.
TEST_F(StatsShmTest, OtherLayoutIsReadByName) {
  const pid_t dead = in_child([] {});
  const std::string path = "/dev/shm/softrdma." + dev_ + "." + std::to_string(dead) + ".0";
  const int fd = open(path.c_str(), O_RDWR | O_CREAT | O_EXCL, 0644);
  ASSERT_GE(fd, 0);
  constexpr uint32_t kN = 3, kCountersAt = 128, kNamesAt = kCountersAt + kN * 8, kLen = 24;
  std::vector<uint8_t> file(kNamesAt + kN * kLen);
  StatsRegion::Header h{};
  h.magic = StatsRegion::kMagic;
  h.version = StatsRegion::kVersion;
  h.num_counters = kN;
  h.counters_offset = kCountersAt;
  h.names_offset = kNamesAt;
  h.name_len = kLen;
  h.pid = dead;
  std::strcpy(h.device, dev_.c_str());
  std::memcpy(file.data(), &h, sizeof h);
  const char* names[kN] = {"rx_packets", "some_future_counter", "tx_packets"};
  const uint64_t values[kN] = {3, 99, 4};
  for (uint32_t i = 0; i < kN; ++i) {
    std::memcpy(file.data() + kCountersAt + i * 8, &values[i], 8);
    std::strcpy(reinterpret_cast<char*>(file.data() + kNamesAt + i * kLen), names[i]);
  }
  ASSERT_EQ(write(fd, file.data(), file.size()), static_cast<ssize_t>(file.size()));
  close(fd);

  auto s = StatsRegion::sum(dev_);
  EXPECT_EQ(s[idx(Counter::rx_packets)], 3u);
  EXPECT_EQ(s[idx(Counter::tx_packets)], 4u);
  uint64_t total = 0;
  for (uint64_t v : s) total += v;
  EXPECT_EQ(total, 7u);

  EXPECT_EQ(StatsRegion::collect_garbage(dev_), 1);
  EXPECT_FALSE(exists(path));
  s = StatsRegion::sum(dev_);
  EXPECT_EQ(s[idx(Counter::rx_packets)], 3u);
  EXPECT_EQ(s[idx(Counter::tx_packets)], 4u);
}

TEST_F(StatsShmTest, RejectsBadDeviceNames) {
  EXPECT_EQ(StatsRegion::create("a/b").error(), EINVAL);
  EXPECT_EQ(StatsRegion::create("").error(), EINVAL);
  EXPECT_EQ(StatsRegion::create(std::string(64, 'x')).error(), EINVAL);
  EXPECT_TRUE(StatsRegion::create(std::string(63, 'x')).has_value());
  StatsRegion::remove_all(std::string(63, 'x'));
}

}  // namespace
}  // namespace softrdma::io
