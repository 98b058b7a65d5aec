// The kernels for AVX-512 with AVX512-BF16: avx512bw's table, whose bf16
// attention for many queries runs on bf16 pairs (vdpbf16ps). Built with
// -mavx512f -mavx512cd -mavx512dq -mavx512bw -mavx512bf16 -mfma; only the
// pair kernel is compiled here, the rest is arch_avx512bw.cpp's.
#include "kernel_table.hpp"

#include <qkv/kernels/attention.hpp>
#include <qkv/kernels/attention_prefill_bf16.hpp>

namespace qkv::kernels {

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
    t.f32_bf16.pack = &pairs::pack;
    t.f32_bf16.blocks = &pairs::blocks;
    return t;
  }();
  return table;
}

}  // namespace qkv::kernels
