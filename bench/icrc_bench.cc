// CRC-32 back ends for the ICRC (zlib vs ISA-L) and the ICRC itself, over RoCEv2 packet sizes.
#include <benchmark/benchmark.h>
#include <isa-l/crc.h>
#include <zlib.h>

#include <cstdint>
#include <vector>

#include "wire/icrc.h"

namespace {

std::vector<uint8_t> make_buffer(size_t n) {
  std::vector<uint8_t> b(n);
  for (size_t i = 0; i < n; ++i) b[i] = static_cast<uint8_t>(i * 131 + 7);
  return b;
}

void BM_Zlib(benchmark::State& state) {
  const auto buf = make_buffer(static_cast<size_t>(state.range(0)));
  for (auto _ : state) benchmark::DoNotOptimize(crc32_z(0, buf.data(), buf.size()));
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations()) * state.range(0));
}

void BM_Isal(benchmark::State& state) {
  const auto buf = make_buffer(static_cast<size_t>(state.range(0)));
  for (auto _ : state) benchmark::DoNotOptimize(crc32_gzip_refl(0, buf.data(), buf.size()));
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations()) * state.range(0));
}

// The two CRC calls of a short packet: the 48-byte masked pseudo header, then the rest.
void BM_IcrcForUdp(benchmark::State& state) {
  const auto bth_to_pad = make_buffer(static_cast<size_t>(state.range(0)));
  softrdma::wire::Endpoint src, dst;
  softrdma::wire::Gid::parse("198.18.0.1", &src.addr);
  softrdma::wire::Gid::parse("198.18.0.2", &dst.addr);
  src.port = 49458;
  dst.port = 4791;
  for (auto _ : state) benchmark::DoNotOptimize(softrdma::wire::icrc_for_udp(src, dst, bth_to_pad));
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations()) * state.range(0));
}

// The one pass of a packet in a buffer of the caller's, with the pseudo header's CRC from the cache.
void BM_IcrcInPlace(benchmark::State& state) {
  auto bth_to_pad = make_buffer(static_cast<size_t>(state.range(0)));
  softrdma::wire::Endpoint src, dst;
  softrdma::wire::Gid::parse("198.18.0.1", &src.addr);
  softrdma::wire::Gid::parse("198.18.0.2", &dst.addr);
  src.port = 49458;
  dst.port = 4791;
  for (auto _ : state)
    benchmark::DoNotOptimize(softrdma::wire::icrc_in_place(src, dst, std::span<uint8_t>(bth_to_pad)));
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations()) * state.range(0));
}

// 48 = CRC input of an ACK (IBTA.md 6); 60 = pseudo header; 1036/4108 = BTH + PMTU payload.
BENCHMARK(BM_Zlib)->Arg(48)->Arg(60)->Arg(256)->Arg(1036)->Arg(4108)->Arg(65536);
BENCHMARK(BM_Isal)->Arg(48)->Arg(60)->Arg(256)->Arg(1036)->Arg(4108)->Arg(65536);
BENCHMARK(BM_IcrcForUdp)->Arg(16)->Arg(1036)->Arg(4108);
BENCHMARK(BM_IcrcInPlace)->Arg(16)->Arg(1036)->Arg(4108);

}  // namespace
