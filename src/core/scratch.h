// Per-call scratch arrays of the data path, left unconstructed: each call fills the elements it reads.
// Their default member initialisers would otherwise be run for the whole array on every call, most of
// which use one element or none (an empty poll, a post of one WR).
#pragma once

#include <cstddef>
#include <type_traits>

namespace softrdma::core {

template <class T, size_t N>
union Scratch {
  static_assert(std::is_trivially_destructible_v<T>, "no destructor runs for the elements");
  Scratch() {}
  T at[N];
};

}  // namespace softrdma::core
