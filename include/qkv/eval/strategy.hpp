// The evaluation strategies a user can ask for by name.
#pragma once

namespace qkv {

// Node by node: every intermediate, the n×m score matrix among them, is
// materialised, each by its own kernel.
struct naive_t {
  explicit constexpr naive_t() = default;
};
inline constexpr naive_t naive{};

// softmax(S) * V as one blocked online-softmax loop nest, with no n×m
// buffer; S is Q * transpose(K), scaled, masked or biased. An expression
// with no fused form is a compile error.
struct fused_t {
  explicit constexpr fused_t() = default;
};
inline constexpr fused_t fused{};

}  // namespace qkv
