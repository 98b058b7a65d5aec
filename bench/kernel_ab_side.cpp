// One side of tools/kernel_ab.sh: the fused attention kernel of the working
// tree, as kernel_ab_work. The script compiles a copy of this file against
// a commit's headers, with qkv and kernel_ab_work renamed to qkv_base and
// kernel_ab_base, so that both kernels link into one program.
#include <qkv/kernels/attention.hpp>

#include <cmath>
#include <cstddef>
#include <vector>

#include "kernel_ab.hpp"

namespace {

using arch = xsimd::default_arch;  // the best set -march allows
using kernel = qkv::kernels::attention_kernel<arch, float>;

qkv::kernels::attention_problem<float> problem;
std::vector<float, xsimd::aligned_allocator<float, 64>> shared, scratch, parts;

void set_up(const kernel_ab::inputs& in) {
  const auto d = static_cast<std::ptrdiff_t>(in.d);
  problem = {{in.q, in.t, in.d, d, 1}, {in.k, in.t, in.d, d, 1}, {in.v, in.t, in.d, d, 1}, {in.out, in.t, in.d, d, 1},
             1.0f / std::sqrt(float(in.d))};
  // (the bounds' field, or before it a field of the problem's own: the side
  // is compiled against the base commit's headers too)
  [](auto& p, bool causal) {
    if constexpr (requires { p.bounds.causal; }) p.bounds.causal = causal;
    else p.causal = causal;
  }(problem, in.causal);
  shared.assign(kernel::shared_size(in.t, in.t, in.d, in.d), 0.0f);
  scratch.assign(kernel::scratch_size(in.t, in.t, in.d), 0.0f);
  parts.assign(kernel::decode_parts(in.t, in.t) * kernel::decode_part_size(in.t, in.d), 0.0f);
}

// What one fused call does on one thread: pack K and V, then every query
// block; a few queries decode instead.
void run() {
  if (kernel::sizes.decodes(problem.q.rows)) return kernel::decode(problem, scratch.data(), parts.data());
  kernel::pack(problem, shared.data());
  kernel::blocks(problem, shared.data(), 0, (problem.q.rows + kernel::block_rows() - 1) / kernel::block_rows(),
                 scratch.data());
}

}  // namespace

extern "C" kernel_ab::side kernel_ab_work() { return {set_up, run}; }
