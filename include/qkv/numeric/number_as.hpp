// An integer (an index, an offset) as a value of the type a functor computes
// in: a number, an xsimd batch (every lane) or a dual number of either (a
// constant). Positions handed to the user's functors go through it.
#pragma once

namespace qkv::detail {

template <class V, class I>
V number_as(I x) {
  if constexpr (requires { typename V::element_type; }) return V(static_cast<typename V::element_type>(x));  // dual
  else if constexpr (requires { typename V::value_type; }) return V(static_cast<typename V::value_type>(x));  // batch
  else return static_cast<V>(x);
}

}  // namespace qkv::detail
