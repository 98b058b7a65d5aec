// The attention a BLAS user writes: S = Q Kᵀ·(1/√d) by cblas_sgemm (the scale
// as alpha), a vectorised row softmax (qkv's own kernel, so only the products
// differ), O = S V by cblas_sgemm. One thread.
#include "bench_common.hpp"

#include <cblas.h>

#include <limits>

extern "C" char* openblas_get_corename(void);
extern "C" void openblas_set_num_threads(int);

namespace {

void openblas_attention(benchmark::State& state, const bench::config& c) {
  openblas_set_num_threads(1);
  bench::inputs in(c);
  qkv::matrix<float, qkv::dyn, qkv::dyn> S(c.n, c.m);
  const int n = int(c.n), m = int(c.m), d = int(c.d);
  for (auto _ : state) {
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, n, m, d, 1.0f / std::sqrt(float(d)), in.Q.data(), d,
                in.K.data(), d, 0.0f, S.data(), m);
    if (c.causal) qkv::kernels::mask_causal(qkv::kernels::strided<float>{S.data(), c.n, c.m, m, 1});
    qkv::kernels::softmax_rows(qkv::kernels::strided<float>{S.data(), c.n, c.m, m, 1});
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, d, m, 1.0f, S.data(), m, in.V.data(), d, 0.0f,
                in.O.data(), d);
    benchmark::DoNotOptimize(in.O.data());
  }
  bench::set_counters(state, c);
  state.SetLabel(openblas_get_corename());
}

const int registered = [] {
  bench::register_all("openblas", openblas_attention);
  return 0;
}();

}  // namespace
