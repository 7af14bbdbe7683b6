// softrdma: list the devices and their GID tables, print and reset the counters (like `rdma statistic`).
//
//   softrdma [devices]            devices, ports, MTUs, node GUIDs and GID tables
//   softrdma stats [DEV]          every counter of DEV (or of every device), zeros included
//   softrdma stats --reset [DEV]  zero the counters of DEV (or of every device)
#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <string_view>
#include <vector>

#include "core/counters.h"
#include "io/netif.h"
#include "io/stats_shm.h"

namespace {

using softrdma::io::DeviceInfo;
using softrdma::io::StatsRegion;

void usage(FILE* f) {
  std::fprintf(f,
               "usage: softrdma [devices]\n"
               "       softrdma stats [--pid PID] [DEV]\n"
               "       softrdma stats --reset [DEV]\n"
               "       softrdma --help\n"
               "\n"
               "devices  list the softrdma devices (one per network interface with an address; restrict\n"
               "         them with %s=if1,if2), their state, MTUs, node GUID and GID table\n"
               "stats    print every counter of DEV, or of every device, summed over all processes\n"
               "         (live, exited and retired), or of the process PID alone; --reset zeroes them\n",
               softrdma::io::kDevicesEnv);
}

std::string guid_text(uint64_t g) {
  char buf[24];
  std::snprintf(buf, sizeof buf, "%04x:%04x:%04x:%04x", static_cast<unsigned>(g >> 48 & 0xFFFF),
                static_cast<unsigned>(g >> 32 & 0xFFFF), static_cast<unsigned>(g >> 16 & 0xFFFF),
                static_cast<unsigned>(g & 0xFFFF));
  return buf;
}

// As ibv_devinfo -v prints a GID: eight groups of four hex digits.
std::string gid_text(const softrdma::wire::Gid& gid) {
  std::string s;
  char buf[8];
  for (int i = 0; i < 16; i += 2) {
    std::snprintf(buf, sizeof buf, "%s%02x%02x", i != 0 ? ":" : "", gid.raw[i], gid.raw[i + 1]);
    s += buf;
  }
  return s;
}

int cmd_devices() {
  const std::vector<DeviceInfo> devs = softrdma::io::list_devices();
  if (devs.empty()) {
    std::printf("no devices\n");
    return 0;
  }
  for (const auto& d : devs) {
    std::printf("%s\n", d.name.c_str());
    std::printf("    interface:   %s (ifindex %d)\n", d.ifname.c_str(), d.ifindex);
    std::printf("    state:       %s\n", d.active ? "PORT_ACTIVE (4)" : "PORT_DOWN (1)");
    std::printf("    mtu:         %u (interface), %u (active_mtu, enum %u), 4096 (max_mtu)\n", d.if_mtu,
                d.active_mtu_bytes, d.active_mtu_enum);
    std::printf("    node_guid:   %s\n", guid_text(d.node_guid).c_str());
    std::printf("    mac:         %02x:%02x:%02x:%02x:%02x:%02x\n", d.mac[0], d.mac[1], d.mac[2], d.mac[3],
                d.mac[4], d.mac[5]);
    std::printf("    link_layer:  Ethernet\n");
    for (size_t i = 0; i < d.gids.size(); ++i) {
      const auto& e = d.gids[i];
      std::printf("    GID[%3zu]:    %s, %s, %s\n", i, gid_text(e.gid).c_str(),
                  e.roce_v2 ? "RoCE v2" : "RoCE v1", e.gid.to_string().c_str());
    }
    std::printf("\n");
  }
  return 0;
}

// The devices to report: the one named, or every listed device plus any that only has stats files.
std::vector<std::string> stats_devices(const char* dev) {
  if (dev != nullptr) return {dev};
  std::vector<std::string> names;
  for (const auto& d : softrdma::io::list_devices()) names.push_back(d.name);
  for (auto& n : StatsRegion::devices_with_files()) {
    bool have = false;
    for (const auto& m : names) have = have || m == n;
    if (!have) names.push_back(n);
  }
  return names;
}

int cmd_stats(int argc, char** argv) {
  bool reset = false;
  int pid = 0;
  const char* dev = nullptr;
  for (int i = 0; i < argc; ++i) {
    if (std::strcmp(argv[i], "--reset") == 0 || std::strcmp(argv[i], "-r") == 0) {
      reset = true;
    } else if (std::strcmp(argv[i], "--pid") == 0) {
      char* end = nullptr;
      const long v = i + 1 < argc ? std::strtol(argv[i + 1], &end, 10) : 0;
      if (v <= 0 || v > INT32_MAX || *end != '\0') {
        std::fprintf(stderr, "softrdma stats: --pid needs a process id\n");
        return 2;
      }
      pid = static_cast<int>(v);
      ++i;
    } else if (argv[i][0] == '-') {
      std::fprintf(stderr, "softrdma stats: unknown option %s\n", argv[i]);
      usage(stderr);
      return 2;
    } else if (dev == nullptr) {
      dev = argv[i];
    } else {
      usage(stderr);
      return 2;
    }
  }
  if (dev != nullptr && std::strlen(dev) > StatsRegion::kMaxDeviceName) {
    std::fprintf(stderr, "softrdma stats: device name too long: %s\n", dev);
    return 2;
  }
  for (const auto& name : stats_devices(dev)) {
    if (reset) {
      StatsRegion::reset(name);
      std::printf("%s: counters reset\n", name.c_str());
      continue;
    }
    const auto totals = StatsRegion::sum(name, pid);
    std::printf("link %s/1\n", name.c_str());
    for (uint32_t i = 0; i < softrdma::kNumCounters; ++i) {
      const auto& info = softrdma::kCounterInfo[i];
      std::printf("    %-24.*s %20" PRIu64 "    %.*s\n", static_cast<int>(info.name.size()), info.name.data(),
                  totals[i], static_cast<int>(info.description.size()), info.description.data());
    }
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  const std::string_view cmd = argc > 1 ? argv[1] : "devices";
  if (cmd == "--help" || cmd == "-h" || cmd == "help") {
    usage(stdout);
    return 0;
  }
  if (cmd == "devices" || cmd == "dev") return cmd_devices();
  if (cmd == "stats" || cmd == "statistic") return cmd_stats(argc - 2, argv + 2);
  std::fprintf(stderr, "softrdma: unknown command %.*s\n", static_cast<int>(cmd.size()), cmd.data());
  usage(stderr);
  return 2;
}
