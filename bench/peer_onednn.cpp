// The attention a oneDNN user writes, node by node: S = Q Kᵀ·(1/√d) by a
// matmul primitive (the scale as its output scale; under causal, a binary
// add of a 0/−∞ mask as a post-op, so the masked softmax reads it), the
// softmax primitive on the rows, O = S V by a second matmul. Primitives are
// created once, outside the timed loop, as a framework caches them. One
// thread (oneDNN's OpenMP runtime, set to one thread).
#include "bench_common.hpp"

#include <oneapi/dnnl/dnnl.hpp>
#include <omp.h>

#include <cmath>
#include <limits>
#include <unordered_map>
#include <vector>

namespace {

using tag = dnnl::memory::format_tag;
using dt = dnnl::memory::data_type;

// The scores' attributes: the output scale 1/√d and, under causal, a binary
// add of a 0/−∞ mask (bottom-right aligned, as qkv's) as a post-op.
struct scores_attributes {
  dnnl::primitive_attr attr;
  qkv::matrix<float, qkv::dyn, qkv::dyn> mask;
  scores_attributes(const bench::config& c, const dnnl::memory::desc& s_md)
      : mask(c.causal ? c.n : 1, c.causal ? c.m : 1) {
    attr.set_output_scales(0, {1.0f / std::sqrt(float(c.d))});
    if (!c.causal) return;
    for (std::size_t i = 0; i < c.n; ++i)
      for (std::size_t j = 0; j < c.m; ++j)
        mask(i, j) = j <= i + (c.m - c.n) ? 0.0f : -std::numeric_limits<float>::infinity();
    dnnl::post_ops ops;
    ops.append_binary(dnnl::algorithm::binary_add, s_md);
    attr.set_post_ops(ops);
  }
};

void onednn_attention(benchmark::State& state, const bench::config& c) {
  omp_set_num_threads(1);
  dnnl::engine engine(dnnl::engine::kind::cpu, 0);
  dnnl::stream stream(engine);
  bench::inputs in(c);
  const auto n = dnnl::memory::dim(c.n), m = dnnl::memory::dim(c.m), d = dnnl::memory::dim(c.d);

  const dnnl::memory::desc q_md({n, d}, dt::f32, tag::ab), kt_md({d, m}, dt::f32, tag::ba);
  const dnnl::memory::desc s_md({n, m}, dt::f32, tag::ab), v_md({m, d}, dt::f32, tag::ab);
  const dnnl::memory::desc o_md({n, d}, dt::f32, tag::ab);
  dnnl::memory q(q_md, engine, in.Q.data()), kt(kt_md, engine, in.K.data()), v(v_md, engine, in.V.data());
  dnnl::memory o(o_md, engine, in.O.data()), s(s_md, engine);

  // Q Kᵀ / √d, plus the causal mask (bottom-right aligned, as qkv's).
  scores_attributes sa(c, s_md);
  const dnnl::primitive_attr& scores_attr = sa.attr;
  dnnl::memory mask_mem(s_md, engine, sa.mask.data());
  const dnnl::matmul scores(dnnl::matmul::primitive_desc(dnnl::matmul::desc(q_md, kt_md, s_md), scores_attr, engine));
  const dnnl::softmax_forward softmax(dnnl::softmax_forward::primitive_desc(
      dnnl::softmax_forward::desc(dnnl::prop_kind::forward_inference, s_md, 1), engine));
  const dnnl::matmul values(dnnl::matmul::primitive_desc(dnnl::matmul::desc(s_md, v_md, o_md), engine));

  std::unordered_map<int, dnnl::memory> scores_args{{DNNL_ARG_SRC, q}, {DNNL_ARG_WEIGHTS, kt}, {DNNL_ARG_DST, s}};
  if (c.causal) scores_args.insert({DNNL_ARG_ATTR_MULTIPLE_POST_OP(0) | DNNL_ARG_SRC_1, mask_mem});
  const std::unordered_map<int, dnnl::memory> softmax_args{{DNNL_ARG_SRC, s}, {DNNL_ARG_DST, s}};
  const std::unordered_map<int, dnnl::memory> values_args{{DNNL_ARG_SRC, s}, {DNNL_ARG_WEIGHTS, v}, {DNNL_ARG_DST, o}};
  for (auto _ : state) {
    scores.execute(stream, scores_args);
    softmax.execute(stream, softmax_args);
    values.execute(stream, values_args);
    stream.wait();
    benchmark::DoNotOptimize(in.O.data());
  }
  bench::set_counters(state, c);
  state.SetLabel(std::string("oneDNN ") + std::to_string(dnnl::version()->major) + "." +
                 std::to_string(dnnl::version()->minor));
}

// The same on bf16 inputs, as a bf16 model runs it: Q, K and V in bf16, the
// scores in float (the matmul accumulates in float), the softmax in float,
// its weights reordered to bf16 for the second matmul, the output float.
// Where the CPU lacks AVX512-BF16 oneDNN picks its own conversion path.
void onednn_attention_bf16(benchmark::State& state, const bench::config& c) {
  omp_set_num_threads(1);
  dnnl::engine engine(dnnl::engine::kind::cpu, 0);
  dnnl::stream stream(engine);
  bench::inputs in(c);
  const auto n = dnnl::memory::dim(c.n), m = dnnl::memory::dim(c.m), d = dnnl::memory::dim(c.d);
  auto to_bf16 = [](const float* x, std::size_t count) {
    std::vector<qkv::bf16> r(count);
    for (std::size_t k = 0; k < count; ++k) r[k] = qkv::bf16(x[k]);
    return r;
  };
  std::vector<qkv::bf16> q16 = to_bf16(in.Q.data(), c.n * c.d), k16 = to_bf16(in.K.data(), c.m * c.d),
                         v16 = to_bf16(in.V.data(), c.m * c.d);

  const dnnl::memory::desc q_md({n, d}, dt::bf16, tag::ab), kt_md({d, m}, dt::bf16, tag::ba);
  const dnnl::memory::desc s_md({n, m}, dt::f32, tag::ab), p_md({n, m}, dt::bf16, tag::ab);
  const dnnl::memory::desc v_md({m, d}, dt::bf16, tag::ab), o_md({n, d}, dt::f32, tag::ab);
  dnnl::memory q(q_md, engine, q16.data()), kt(kt_md, engine, k16.data()), v(v_md, engine, v16.data());
  dnnl::memory o(o_md, engine, in.O.data()), s(s_md, engine), p(p_md, engine);

  scores_attributes sa(c, s_md);
  const dnnl::primitive_attr& scores_attr = sa.attr;
  dnnl::memory mask_mem(s_md, engine, sa.mask.data());
  dnnl::matmul scores, values;
  try {  // oneDNN 2.6 has bf16 matmuls only on CPUs with AVX-512 (avx512_core)
    scores = dnnl::matmul(dnnl::matmul::primitive_desc(dnnl::matmul::desc(q_md, kt_md, s_md), scores_attr, engine));
    values = dnnl::matmul(dnnl::matmul::primitive_desc(dnnl::matmul::desc(p_md, v_md, o_md), engine));
  } catch (const dnnl::error&) {
    state.SkipWithError("oneDNN has no bf16 matmul for this CPU");
    return;
  }
  const dnnl::softmax_forward softmax(dnnl::softmax_forward::primitive_desc(
      dnnl::softmax_forward::desc(dnnl::prop_kind::forward_inference, s_md, 1), engine));
  const dnnl::reorder to_p(s, p);

  std::unordered_map<int, dnnl::memory> scores_args{{DNNL_ARG_SRC, q}, {DNNL_ARG_WEIGHTS, kt}, {DNNL_ARG_DST, s}};
  if (c.causal) scores_args.insert({DNNL_ARG_ATTR_MULTIPLE_POST_OP(0) | DNNL_ARG_SRC_1, mask_mem});
  const std::unordered_map<int, dnnl::memory> softmax_args{{DNNL_ARG_SRC, s}, {DNNL_ARG_DST, s}};
  const std::unordered_map<int, dnnl::memory> values_args{{DNNL_ARG_SRC, p}, {DNNL_ARG_WEIGHTS, v}, {DNNL_ARG_DST, o}};
  for (auto _ : state) {
    scores.execute(stream, scores_args);
    softmax.execute(stream, softmax_args);
    to_p.execute(stream, s, p);
    values.execute(stream, values_args);
    stream.wait();
    benchmark::DoNotOptimize(in.O.data());
  }
  bench::set_counters(state, c);
  state.SetLabel(std::string("oneDNN ") + std::to_string(dnnl::version()->major) + "." +
                 std::to_string(dnnl::version()->minor) + " bf16");
}

const int registered = [] {
  bench::register_all("onednn", onednn_attention);
  bench::register_all("onednn_bf16", onednn_attention_bf16);
  return 0;
}();

}  // namespace
