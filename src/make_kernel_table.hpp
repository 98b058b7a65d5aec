// Instantiates every kernel for one instruction set. Included only by the
// arch_*.cpp files, each compiled with its own -m flags.
#pragma once

#include "kernel_table.hpp"

#include <qkv/kernels/attention.hpp>
#include <qkv/kernels/attention_backward.hpp>
#include <qkv/kernels/elementwise.hpp>
#include <qkv/kernels/gemm.hpp>
#include <qkv/kernels/softmax.hpp>
#include <qkv/kernels/widen.hpp>

namespace qkv::kernels {

// The backward without extensions: the compiled kernels' functions.
template <class Arch, class T>
struct compiled_backward {
  using kernel = attention_backward_kernel<Arch, T, no_extension, blocking_of<Arch, T>()>;
  static void key_group(const attention_problem<T>& p, const attention_gradient<T>& g, T* shared, std::size_t kg,
                        T* scratch, bool with_dq) {
    kernel::key_group(p, g, shared, kg, scratch, with_dq, no_extension{});
  }
  static void query_block(const attention_problem<T>& p, const attention_gradient<T>& g, T* shared, std::size_t qb,
                          T* scratch) {
    kernel::query_block(p, g, shared, qb, scratch, no_extension{});
  }
};

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
                        .pack = &at::template pack<T>,
                        .blocks = &at::blocks,
                        .decode_part = &at::template decode_part<T>,
                        .decode_merge = &at::decode_merge},
          .backward = {.shared_size = &compiled_backward<Arch, T>::kernel::shared_size,
                       .scratch_size = &compiled_backward<Arch, T>::kernel::scratch_size,
                       .query_blocks = &compiled_backward<Arch, T>::kernel::query_blocks,
                       .key_blocks = &compiled_backward<Arch, T>::kernel::key_blocks,
                       .group_blocks = &compiled_backward<Arch, T>::kernel::group_blocks,
                       .key_groups = &compiled_backward<Arch, T>::kernel::key_groups,
                       .prepare = &compiled_backward<Arch, T>::kernel::prepare,
                       .key_group = &compiled_backward<Arch, T>::key_group,
                       .query_block = &compiled_backward<Arch, T>::query_block,
                       .finish = &compiled_backward<Arch, T>::kernel::finish}};
}

// Float attention over K and V stored as S: the float kernel's blocks and
// merge, its packing and decode parts converting as they read.
template <class Arch, class S>
constexpr attention_entries<float, S> make_attention_entries() {
  using at = attention_kernel<Arch, float>;
  return {.sizes = at::sizes,
          .pack = &at::template pack<S>,
          .blocks = &at::blocks,
          .decode_part = &at::template decode_part<S>,
          .decode_merge = &at::decode_merge};
}

template <class Isa>
const kernel_table& kernels_of() noexcept {
  using arch = typename Isa::arch;
  static constexpr kernel_table table{arch_index(Isa::name), make_kernel_set<arch, float>(), make_kernel_set<arch, double>(),
                                      make_attention_entries<arch, bf16>(), make_attention_entries<arch, f16>(),
                                      &widen_kernel<arch>::template run<bf16>, &widen_kernel<arch>::template run<f16>};
  return table;
}

}  // namespace qkv::kernels
