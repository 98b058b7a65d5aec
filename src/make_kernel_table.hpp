// Instantiates every kernel for one instruction set. Included only by the
// arch_*.cpp files, each compiled with its own -m flags.
#pragma once

#include "kernel_table.hpp"

#include <qkv/kernels/attention.hpp>
#include <qkv/kernels/elementwise.hpp>
#include <qkv/kernels/gemm.hpp>
#include <qkv/kernels/softmax.hpp>

namespace qkv::kernels {

template <class Arch, class T>
constexpr kernel_set<T> make_kernel_set() {
  using g = gemm_kernel<Arch, T>;
  using e = elementwise_kernel<Arch, T>;
  using at = attention_kernel<Arch, T>;
  return {.gemm_workspace = &g::workspace,
          .gemm = &g::run,
          .softmax_rows = &softmax_kernel<Arch, T>::run,
          .multiply = &e::multiply,
          .divide = &e::divide,
          .add = &e::add,
          .subtract = &e::subtract,
          .copy = &e::copy,
          .attention = {.sizes = at::sizes,
                        .pack = &at::pack,
                        .blocks = &at::blocks,
                        .decode_part = &at::decode_part,
                        .decode_merge = &at::decode_merge}};
}

template <class Isa>
const kernel_table& kernels_of() noexcept {
  using arch = typename Isa::arch;
  static constexpr kernel_table table{arch_index_of<arch>, make_kernel_set<arch, float>(), make_kernel_set<arch, double>()};
  return table;
}

}  // namespace qkv::kernels
