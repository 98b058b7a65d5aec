// One side of tools/kernel_ab.sh: the fused attention kernel of the working
// tree, as kernel_ab_work. The script compiles a copy of this file against
// a commit's headers, with qkv and kernel_ab_work renamed to qkv_base and
// kernel_ab_base, so that both kernels link into one program.
#include <qkv/kernels/attention.hpp>
#if defined(__AVX512BF16__)
#include <qkv/kernels/attention_prefill_bf16.hpp>
#endif

#include <cmath>
#include <cstddef>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "kernel_ab.hpp"

namespace {

using arch = xsimd::default_arch;  // the best set -march allows
using kernel = qkv::kernels::attention_kernel<arch, float>;

qkv::kernels::attention_problem<float> problem;
std::vector<float, xsimd::aligned_allocator<float, 64>> shared, scratch, parts;

// Causal on a problem: the bounds' field, or before it a field of the
// problem's own (the side is compiled against the base commit's headers too).
template <class P>
void set_causal(P& p, bool causal) {
  if constexpr (requires { p.bounds.causal; }) p.bounds.causal = causal;
  else p.causal = causal;
}

// QKV_AB_PAIRS=1: the bf16-pair prefill (attention_prefill_bf16.hpp) on the
// inputs rounded to bf16, where the compiler targets AVX512-BF16.
#if defined(__AVX512BF16__)
using pair_kernel = qkv::kernels::attention_prefill_bf16<qkv::kernels::bf16_pairs_avx512>;
qkv::kernels::attention_problem<float, qkv::bf16> pair_problem;
std::vector<float> q16;
std::vector<qkv::bf16> k16, v16;
bool pairs = false;

void set_up_pairs(const kernel_ab::inputs& in) {
  const std::size_t size = in.t * in.d;
  q16.resize(size), k16.resize(size), v16.resize(size);
  for (std::size_t x = 0; x < size; ++x)
    q16[x] = float(qkv::bf16(in.q[x])), k16[x] = qkv::bf16(in.k[x]), v16[x] = qkv::bf16(in.v[x]);
  const auto d = static_cast<std::ptrdiff_t>(in.d);
  pair_problem = {{q16.data(), in.t, in.d, d, 1}, {k16.data(), in.t, in.d, d, 1}, {v16.data(), in.t, in.d, d, 1},
                  {in.out, in.t, in.d, d, 1}, 1.0f / std::sqrt(float(in.d))};
  pair_problem.queries_in_storage_type = true;
  set_causal(pair_problem, in.causal);
  problem = pair_problem.without_kv_data();
}
#endif

void set_up(const kernel_ab::inputs& in) {
  const auto d = static_cast<std::ptrdiff_t>(in.d);
  problem = {{in.q, in.t, in.d, d, 1}, {in.k, in.t, in.d, d, 1}, {in.v, in.t, in.d, d, 1}, {in.out, in.t, in.d, d, 1},
             1.0f / std::sqrt(float(in.d))};
  set_causal(problem, in.causal);
  shared.assign(kernel::shared_size(in.t, in.t, in.d, in.d), 0.0f);
  scratch.assign(kernel::scratch_size(in.t, in.t, in.d), 0.0f);
  parts.assign(kernel::decode_parts(in.t, in.t) * kernel::decode_part_size(in.t, in.d), 0.0f);
#if defined(__AVX512BF16__)
  const char* env = std::getenv("QKV_AB_PAIRS");
  pairs = env != nullptr && std::strcmp(env, "1") == 0 && !kernel::sizes.decodes(in.t);
  if (pairs) set_up_pairs(in);
#endif
}

// What one fused call does on one thread: pack K and V, then every query
// block; a few queries decode instead.
void run() {
#if defined(__AVX512BF16__)
  if (pairs) {
    pair_kernel::pack(pair_problem, shared.data());
    pair_kernel::blocks(problem, shared.data(), 0, (problem.q.rows + kernel::block_rows() - 1) / kernel::block_rows(),
                        scratch.data());
    return;
  }
#endif
  if (kernel::sizes.decodes(problem.q.rows)) return kernel::decode(problem, scratch.data(), parts.data());
  kernel::pack(problem, shared.data());
  kernel::blocks(problem, shared.data(), 0, (problem.q.rows + kernel::block_rows() - 1) / kernel::block_rows(),
                 scratch.data());
}

}  // namespace

extern "C" kernel_ab::side kernel_ab_work() { return {set_up, run}; }
