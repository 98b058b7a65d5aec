// One instruction set's kernels as a table of plain function pointers. Each
// src/arch_*.cpp fills one, compiled with that instruction set's flags;
// dispatch.cpp picks a table once, at first use.
#pragma once

#include <qkv/kernels/arch_list.hpp>
#include <qkv/kernels/attention_problem.hpp>
#include <qkv/kernels/blocking.hpp>
#include <qkv/kernels/strided.hpp>
#include <qkv/numeric/float16.hpp>

#include <cstddef>

namespace qkv::kernels {

// The fused attention: its sizes (blocking.hpp says which buffers they
// imply), and the pieces src/attention_forward.cpp spreads over threads.
// With K and V stored as S, pack and decode_part read them; the blocks and
// the merge read only the packed copy or the parts, as for S = T.
template <class T, class S = T>
struct attention_entries {
  blocking sizes;
  void (*pack)(const attention_problem<T, S>& problem, T* shared);
  void (*blocks)(const attention_problem<T>& problem, const T* shared, std::size_t b0, std::size_t b1, T* scratch);
  void (*decode_part)(const attention_problem<T, S>& problem, std::size_t part, T* scratch, T* part_out);
  void (*decode_merge)(const attention_problem<T>& problem, const T* parts, std::size_t count);
};

// The fused backward (kernels/attention_backward.hpp): the buffer sizes, and
// the pieces src/attention_backward.cpp spreads over threads.
template <class T>
struct backward_entries {
  std::size_t (*shared_size)(std::size_t n, std::size_t m, std::size_t dk, std::size_t dv);
  std::size_t (*scratch_size)();
  std::size_t (*query_blocks)(std::size_t n);
  std::size_t (*key_blocks)(std::size_t m);
  std::size_t (*group_blocks)(std::size_t m, std::size_t dk, std::size_t dv);
  std::size_t (*key_groups)(std::size_t m, std::size_t dk, std::size_t dv);
  void (*prepare)(const attention_problem<T>& p, const attention_gradient<T>& g, T* shared);
  void (*key_group)(const attention_problem<T>& p, const attention_gradient<T>& g, T* shared, std::size_t kg,
                    T* scratch, bool with_dq);
  void (*query_block)(const attention_problem<T>& p, const attention_gradient<T>& g, T* shared, std::size_t qb,
                      T* scratch);
  void (*finish)(const attention_problem<T>& p, const attention_gradient<T>& g, const T* shared);
};

template <class T>
struct kernel_set {
  std::size_t (*gemm_workspace)(std::size_t m, std::size_t n, std::size_t k);
  void (*gemm)(strided<const T> a, strided<const T> b, T* c, std::ptrdiff_t ldc, T* work);
  void (*softmax_rows)(strided<T> x, T sink);
  void (*multiply)(strided<T> x, T s);
  void (*divide)(strided<T> x, T s);
  void (*add)(strided<T> x, strided<const T> y);
  void (*subtract)(strided<T> x, strided<const T> y);
  void (*copy)(strided<const T> src, strided<T> dst);
  attention_entries<T> attention;
  backward_entries<T> backward;
};

struct kernel_table {
  std::size_t arch;  // its index in arch_list
  kernel_set<float> f32;
  kernel_set<double> f64;
  attention_entries<float, bf16> f32_bf16;  // float queries, K and V in bf16
  attention_entries<float, f16> f32_f16;
  // 2-byte matrices read into float (kernels/widen.hpp).
  void (*widen_bf16)(strided<const bf16> src, strided<float> dst);
  void (*widen_f16)(strided<const f16> src, strided<float> dst);
  bool bf16_pairs = false;  // whether f32_bf16's prefill multiplies bf16 pairs (vdpbf16ps)
};

// QKV_BF16_PAIRS: 1 or 0 where it forces the bf16 pair kernel on or off
// (avx512bf16 only), −1 where it is unset or empty; dispatch.cpp throws
// std::invalid_argument for any other value before a table is made.
int bf16_pairs_forced();

// The kernels of instruction set Isa of arch_list (one whose Isa::built
// holds): defined in make_kernel_table.hpp, instantiated by
// src/arch_<Isa::name>.cpp alone, with that set's flags.
template <class Isa>
const kernel_table& kernels_of() noexcept;
// avx512bf16's: avx512bw's, with the bf16 attention on pairs where they
// pay (src/arch_avx512bf16.cpp).
template <>
const kernel_table& kernels_of<isa_avx512bf16>() noexcept;

// The kernels of the instruction set picked (dispatch.cpp): throws as
// set_arch does while QKV_ARCH names a set that cannot run.
template <class T>
const kernel_set<T>& active_kernels();

// The fused attention in float over K and V stored as S (float, bf16 or
// f16), of the instruction set picked; throws as active_kernels does.
template <class S>
const attention_entries<float, S>& active_attention();

}  // namespace qkv::kernels
