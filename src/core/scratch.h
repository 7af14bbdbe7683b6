// Per-call helpers of the data path. Scratch arrays, left unconstructed: each call fills the elements it
// reads. Their default member initialisers would otherwise be run for the whole array on every call, most
// of which use one element or none (an empty poll, a post of one WR). And a thread-local's address, looked
// up once per call.
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

// The address of thread-local `t`, computed once: GCC computes it again at each use that follows a call
// (in the shared library a TLS descriptor call each time; a poll of an empty CQ made five). The empty asm
// hides where the pointer came from, so the compiler keeps it in a register instead.
template <class T>
T& tls_once(T& t) {
  T* p = &t;
  asm("" : "+r"(p));
  return *p;
}

}  // namespace softrdma::core
