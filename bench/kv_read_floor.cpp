// The memory-read floor of decoding from a 2-byte cache: every element read
// once, converted to float with the vector instructions of this machine
// (compiled with -march=native, as the FMA probe is) and summed. The kernel
// cannot read the cache faster than this.
#include "kv_read_floor.hpp"

#include <qkv/kernels/load_float.hpp>

#include <xsimd/xsimd.hpp>

namespace bench {
namespace {

template <class S>
float sum(const S* p, std::size_t count) {
  using batch = xsimd::batch<float>;
  constexpr std::size_t W = batch::size;
  batch a0(0.0f), a1(0.0f), a2(0.0f), a3(0.0f);  // independent sums: a load, not an add, at a time
  std::size_t x = 0;
  for (; x + 4 * W <= count; x += 4 * W) {
    a0 += qkv::kernels::load_float<xsimd::default_arch>(p + x);
    a1 += qkv::kernels::load_float<xsimd::default_arch>(p + x + W);
    a2 += qkv::kernels::load_float<xsimd::default_arch>(p + x + 2 * W);
    a3 += qkv::kernels::load_float<xsimd::default_arch>(p + x + 3 * W);
  }
  float s = xsimd::hadd((a0 + a1) + (a2 + a3));
  for (; x < count; ++x) s += static_cast<float>(p[x]);
  return s;
}

}  // namespace

float sum_converted(const qkv::bf16* p, std::size_t count) { return sum(p, count); }
float sum_converted(const qkv::f16* p, std::size_t count) { return sum(p, count); }

}  // namespace bench
