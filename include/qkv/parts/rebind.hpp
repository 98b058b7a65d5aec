// The same attention over other queries, keys and values: e = softmax(S) * V
// with a fused form, rebuilt node by node (expr/node.hpp's rebuild) with
// the similarity's Q and K and the product's V replaced, the rest (scale,
// causal, windows, predicates, modifiers, sinks, the slice's position) kept.
// What computing a sequence in parts needs: the same form over each part's
// rows (parts/part.hpp, <qkv/mpi.hpp>). A chain with a bias or a mask matrix,
// whose n × m values belong to the whole, is not rebound (has_rebindable_form).
#pragma once

#include "../eval/fused.hpp"

#include <type_traits>
#include <utility>

namespace qkv::detail {

template <class E>
inline constexpr bool has_rebindable_form = [] {
  if constexpr (!has_fused_form<E>) {
    return false;
  } else {
    constexpr chain_slots s = score_chain<typename fused_form<bare_t<E>>::scores>::slots;
    return !s.bias && !s.mask;
  }
}();

// The operands of e's similarity (Q, K) and its values (V), as written.
template <class S>
const auto& queries_of_chain(const S& s) {
  if constexpr (requires { s.arg(); }) return queries_of_chain(s.arg());
  else return s.lhs();
}
template <class S>
const auto& keys_of_chain(const S& s) {
  if constexpr (requires { s.arg(); }) {
    return keys_of_chain(s.arg());
  } else if constexpr (is_product_v<S>) {
    return s.rhs().arg();  // Q * transpose(K)
  } else {
    return s.rhs();
  }
}
template <class E>
const auto& queries_of(const E& e) {
  return queries_of_chain(e.lhs().arg());
}
template <class E>
const auto& keys_of(const E& e) {
  return keys_of_chain(e.lhs().arg());
}
template <class E>
const auto& values_of(const E& e) {
  return e.rhs();
}

template <class S, class Q, class K>
auto rebind_chain(const S& s, const Q& q, const K& k) {
  if constexpr (requires { s.arg(); }) {
    return s.rebuild(rebind_chain(s.arg(), q, k));  // scale, causal, window, predicate, score_mod
  } else if constexpr (is_product_v<S>) {
    return s.rebuild(q, s.rhs().rebuild(k));
  } else {
    return s.rebuild(q, k);  // a similarity
  }
}

template <class E, class Q, class K, class V>
  requires has_rebindable_form<E>
auto rebind(const E& e, const Q& q, const K& k, const V& v) {
  return e.rebuild(e.lhs().rebuild(rebind_chain(e.lhs().arg(), q, k)), v);
}

}  // namespace qkv::detail
