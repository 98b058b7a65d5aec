// What several test files share beyond the reference: restoring the thread
// count, bit-for-bit comparisons, random tensors, and whether the suite runs
// under an emulator.
#pragma once

#include "reference.hpp"

#include <qkv/qkv.hpp>

#include <cstddef>
#include <cstdlib>
#include <cstring>

namespace test {

// Restores the thread count a test changed.
struct threads_guard {
  std::size_t saved = qkv::threads();
  ~threads_guard() { qkv::set_threads(saved); }
};

// Two matrices (or views) of one shape with the same bits in every element.
template <class A, class B>
bool same_bits(const A& a, const B& b) {
  if (a.rows() != b.rows() || a.cols() != b.cols()) return false;
  for (std::size_t i = 0; i < a.rows(); ++i)
    for (std::size_t j = 0; j < a.cols(); ++j)
      if (std::memcmp(&a(i, j), &b(i, j), sizeof(a(i, j))) != 0) return false;
  return true;
}

// The same for two owning tensors.
template <class T>
bool same_bits_tensor(const T& a, const T& b) {
  return a.extents() == b.extents() && (a.size() == 0 || std::memcmp(a.data(), b.data(), a.size() * sizeof(*a.data())) == 0);
}

// Uniform values in [lo, hi] in every element of an owning tensor.
template <class Tensor>
void fill(Tensor& t, ref::rng& rng, double lo = -1, double hi = 1) {
  for (std::size_t i = 0; i < t.size(); ++i) t.data()[i] = static_cast<typename Tensor::value_type>(rng.uniform(lo, hi));
}

// Whether the suite runs under an emulator (tests/CMakeLists.txt sets
// QKV_TESTS_EMULATED there). What does not depend on the instruction set,
// such as the split of work over threads, is then left to the native runs.
inline bool emulated() {
  const char* s = std::getenv("QKV_TESTS_EMULATED");
  return s != nullptr && *s != '\0' && *s != '0';
}

// Whether an emulated run leaves out an attention of n queries, m keys and
// heads dk, dv: the long-double reference is a software quad on AArch64, and
// under emulation one of more than 2²¹ multiply-adds of it per output column
// costs tens of seconds. The smaller shapes take every tail of the vector
// width, the register tile and the query and key blocks there too.
inline bool emulation_skips(std::size_t n, std::size_t m, std::size_t dk, std::size_t dv) {
  return emulated() && n * m * (dk + dv) > (std::size_t(1) << 21);
}

}  // namespace test
