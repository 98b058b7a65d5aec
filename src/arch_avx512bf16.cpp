// The kernels for AVX-512 with AVX512-BF16: avx512bw's table, whose bf16
// attention for many queries runs on bf16 pairs (vdpbf16ps) where the CPU
// multiplies pairs fast enough. Built with -mavx512f -mavx512cd -mavx512dq
// -mavx512bw -mavx512bf16 -mfma; only the pair kernel is compiled here, the
// rest is arch_avx512bw.cpp's.
#include "kernel_table.hpp"

#include <qkv/kernels/attention.hpp>
#include <qkv/kernels/attention_prefill_bf16.hpp>

#include <immintrin.h>

#include <algorithm>
#include <chrono>

namespace qkv::kernels {
namespace {

// One vdpbf16ps does twice the products of one vfmadd231ps. On Zen 5 the
// pair kernel ran 1.7-1.9x the float kernel's speed (docs/performance.md),
// so pairs pay there. An Intel Xeon of family 6 model 207 issues vdpbf16ps
// once every two cycles, a quarter of its FMA rate (0.47 against 1.92 a
// cycle): there the pair kernel ran at 0.55x the float kernel's speed, and
// bf16 K and V converted while packing (as f16's are) at the float speed.
// So the pair
// kernel is taken where vdpbf16ps runs at least two thirds of the FMA rate:
// 12 independent chains of each, the best of 5 timings, about 0.1 ms once;
// QKV_BF16_PAIRS=1 or 0 (dispatch.cpp) decides instead.
template <class Step>
double chains_ns(Step step) {
  __m512 c[12];
  for (int i = 0; i < 12; ++i) c[i] = _mm512_set1_ps(float(i));
  double best = 1e300;
  for (int round = 0; round < 5; ++round) {
    const auto t0 = std::chrono::steady_clock::now();
    for (int s = 0; s < 512; ++s)
      for (int i = 0; i < 12; ++i) c[i] = step(c[i]);
    const double ns = std::chrono::duration<double, std::nano>(std::chrono::steady_clock::now() - t0).count();
    best = std::min(best, ns);
  }
  for (int i = 0; i < 12; ++i) asm volatile("" : : "v"(c[i]));
  return best;
}

bool pairs_pay() {
  __m512 x = _mm512_set1_ps(0.5f), y = _mm512_set1_ps(0.25f);
  asm volatile("" : "+v"(x), "+v"(y));
  const __m512bh a = _mm512_cvtne2ps_pbh(x, y), b = _mm512_cvtne2ps_pbh(y, x);
  const auto pairs = [&](__m512 c) { return _mm512_dpbf16_ps(c, a, b); };
  const auto fmas = [&](__m512 c) { return _mm512_fmadd_ps(c, x, y); };
  chains_ns(fmas);  // wakes the 512-bit units
  double dp = 1e300, fma = 1e300;
  for (int round = 0; round < 2; ++round) dp = std::min(dp, chains_ns(pairs)), fma = std::min(fma, chains_ns(fmas));
  return dp <= 1.5 * fma;
}

}  // namespace

template <>
const kernel_table& kernels_of<isa_avx512bf16>() noexcept {
  using pairs = attention_prefill_bf16<bf16_pairs_avx512>;
  using decoder = attention_kernel<xsimd::avx512bw, float>;
  static_assert(pairs::W == decoder::prefill::W && decoder::sizes == blocking_of<xsimd::avx512bw, float>());
  static const kernel_table table = [] {
    kernel_table t = kernels_of<isa_avx512bw>();
    t.arch = arch_index(isa_avx512bf16::name);
    // A few queries stay on the decode parts, which convert as they stream:
    // they are bound by reading K and V, not by the products.
    t.bf16_pairs = bf16_pairs_forced() < 0 ? pairs_pay() : bf16_pairs_forced() == 1;
    if (t.bf16_pairs) {
      t.f32_bf16.pack = &pairs::pack;
      t.f32_bf16.blocks = &pairs::blocks;
    }
    return t;
  }();
  return table;
}

}  // namespace qkv::kernels
