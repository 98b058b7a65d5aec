// The fused form's rules, in one place: softmax(S) * V where S is a chain of
// slots around a similarity core (scale, causal, window, mask matrix,
// predicate, bias, modifier), and the rules on which slots a chain may hold and in
// which order. eval/fused.hpp reads an expression's chain into slots and
// asks here whether it fuses; eval(e, fused) names the rule it broke.
#pragma once

#include <string_view>

namespace qkv {

// The first rule an expression breaks on its way to the fused kernel,
// reading its score chain from the similarity outwards; `none` when it fuses.
enum class fusion_rule {
  none,
  not_attention,           // not softmax(S) * V
  not_a_similarity,        // S has no similarity at its core
  two_biases,              // S + B1 + B2
  two_mask_matrices,       // masked(masked(S, M1), M2)
  two_predicates,          // masked(masked(S, p1), p2)
  two_score_mods,          // score_mod(score_mod(S, f), g)
  score_mod_outside_mask,  // score_mod(causal(S), f), score_mod(window(S, w), f), score_mod(masked(S, M), f)
  scale_outside_score_mod, // score_mod(S, f) * c
  bias_outside_score_mod,  // score_mod(S, f) + B
};

// What a rule says, as the compile error and explain(e) word it.
constexpr std::string_view to_string(fusion_rule r) {
  switch (r) {
    case fusion_rule::none: return "fuses";
    case fusion_rule::not_attention: return "not softmax(S) * V";
    case fusion_rule::not_a_similarity: return "the scores are not a similarity";
    case fusion_rule::two_biases: return "two biases in the scores";
    case fusion_rule::two_mask_matrices: return "two mask matrices in the scores";
    case fusion_rule::two_predicates: return "two predicate masks in the scores";
    case fusion_rule::two_score_mods: return "two score_mods in the scores";
    case fusion_rule::score_mod_outside_mask: return "score_mod outside a mask";
    case fusion_rule::scale_outside_score_mod: return "scaling outside a score_mod";
    case fusion_rule::bias_outside_score_mod: return "a bias outside a score_mod";
  }
  return "";
}

namespace detail {

// The slots a node of a score chain fills.
enum class chain_slot { core, scale, causal, window, mask, predicate, bias, modifier, positions };

// What a chain holds so far, from its core outwards, and the first rule it broke.
struct chain_slots {
  fusion_rule broken = fusion_rule::none;
  bool scale = false, causal = false, window = false, mask = false, predicate = false, bias = false, modifier = false,
       positions = false;

  constexpr bool masks() const { return causal || window || mask || predicate; }
};

// The table: each rule says what a slot may not be added around. The kernel
// computes scale·s + bias_scale·B, then the modifier, then the masks, once each.
constexpr fusion_rule rule_broken_by(chain_slot outer, const chain_slots& in) {
  switch (outer) {
    case chain_slot::core:
    case chain_slot::causal:  // causal twice is causal once
    case chain_slot::window:  // windows (and causal) intersect into one
    case chain_slot::positions:  // changes no score (and is one per chain: positions(S, q0, k0))
      return fusion_rule::none;
    case chain_slot::scale:
      // catches score_mod(S, f) * c, gives scale_outside_score_mod: the kernel scales before it modifies.
      if (in.modifier) return fusion_rule::scale_outside_score_mod;
      return fusion_rule::none;
    case chain_slot::mask:
      // catches masked(masked(S, M1), M2), gives two_mask_matrices: the kernel reads one mask matrix.
      if (in.mask) return fusion_rule::two_mask_matrices;
      return fusion_rule::none;
    case chain_slot::predicate:
      // catches masked(masked(S, p1), p2), gives two_predicates: the kernel calls one predicate.
      if (in.predicate) return fusion_rule::two_predicates;
      return fusion_rule::none;
    case chain_slot::bias:
      // catches S + B1 + B2, gives two_biases: the kernel adds one bias matrix.
      if (in.bias) return fusion_rule::two_biases;
      // catches score_mod(S, f) + B, gives bias_outside_score_mod: the kernel adds the bias before it modifies.
      if (in.modifier) return fusion_rule::bias_outside_score_mod;
      return fusion_rule::none;
    case chain_slot::modifier:
      // catches score_mod(score_mod(S, f), g), gives two_score_mods: the kernel calls one modifier.
      if (in.modifier) return fusion_rule::two_score_mods;
      // catches score_mod(causal(S), f), gives score_mod_outside_mask: f would see −∞, and the kernel masks after it modifies.
      if (in.masks()) return fusion_rule::score_mod_outside_mask;
      return fusion_rule::none;
  }
  return fusion_rule::none;
}

// The slots of a chain with `outer` added around `in`; a broken chain stays broken.
constexpr chain_slots add_slot(chain_slots in, chain_slot outer) {
  if (in.broken != fusion_rule::none) return in;
  in.broken = rule_broken_by(outer, in);
  switch (outer) {
    case chain_slot::core: break;
    case chain_slot::scale: in.scale = true; break;
    case chain_slot::causal: in.causal = true; break;
    case chain_slot::window: in.window = true; break;
    case chain_slot::mask: in.mask = true; break;
    case chain_slot::predicate: in.predicate = true; break;
    case chain_slot::bias: in.bias = true; break;
    case chain_slot::modifier: in.modifier = true; break;
    case chain_slot::positions: in.positions = true; break;
  }
  return in;
}

// A similarity core, and what is not one.
inline constexpr chain_slots core_slots{};
// catches scores with no similarity at the bottom (Q * K, exp(S), a matrix), gives not_a_similarity.
inline constexpr chain_slots not_a_chain{fusion_rule::not_a_similarity};

// S + B or B + S (S − B): the chain is the side that takes a bias; with
// neither, the rule the left side broke (or the right one's, when the left
// is no chain at all).
constexpr chain_slots add_bias(const chain_slots& left, const chain_slots& right, bool right_may_be_chain) {
  const chain_slots l = add_slot(left, chain_slot::bias);
  if (l.broken == fusion_rule::none) return l;
  const chain_slots r = right_may_be_chain ? add_slot(right, chain_slot::bias) : not_a_chain;
  if (r.broken == fusion_rule::none || l.broken == fusion_rule::not_a_similarity) return r;
  return l;
}

}  // namespace detail

}  // namespace qkv
