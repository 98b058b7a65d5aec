// A program with a functor of its own, built with qkv::native (or
// qkv-native.pc): its functors are compiled for the instruction set the
// kernels run, and explain(e) says nothing against them.
#include <qkv/qkv.hpp>

#include <cstdio>
#include <string>

int main() {
  using namespace qkv;
  matrix<float, dyn, dyn> Q(4, 32), K(50, 32), V(50, 32);
  for (std::size_t x = 0; x < Q.size(); ++x) Q.data()[x] = float(x % 7) / 7;
  for (std::size_t x = 0; x < K.size(); ++x) K.data()[x] = float(x % 5) / 5, V.data()[x] = float(x % 3);
  const auto cap = [](auto s, auto, auto) { return decltype(s)(10) * xsimd::tanh(s / decltype(s)(10)); };
  const auto e = softmax(score_mod(Q * transpose(K), cap)) * V;
  const std::string what = explain(e);
  const auto O = eval(e);
  std::printf("%s", what.c_str());
  return what.find("your functors") == std::string::npos && O(0, 0) == O(0, 0) ? 0 : 1;
}
