// What the two sides of tools/kernel_ab.sh share: plain C types only, since
// each side is compiled against its own headers.
#pragma once

#include <cstddef>

namespace kernel_ab {

struct inputs {
  const float* q;
  const float* k;
  const float* v;
  float* out;
  std::size_t t, d;  // n = m = t, dk = dv = d
  bool causal;
};

struct side {
  void (*set_up)(const inputs&);
  void (*run)();
};

}  // namespace kernel_ab
