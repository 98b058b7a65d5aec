// tests/softmax_exp_test.cpp again, compiled for AVX-512, where fast_exp2
// splits x into sixteenths, takes 2^(y mod 1) from a table, and scales with
// vscalefps (its bf16 form rounds with vrndscaleps): the same checks of
// accuracy and special values on that form. Its own program
// (exp_avx512_main.cpp), so that no AVX-512 code reaches the suite that runs
// on every CPU.
#include "softmax_exp_test.cpp"

static_assert(std::is_base_of_v<xsimd::avx512f, xsimd::default_arch>, "qkv: this file is compiled for AVX-512");
