// Serving a batch of requests from a paged bf16 K/V cache, as an inference
// engine's attention step does: 6 requests of different prompt lengths
// arrive together; each step, a request still reading its prompt takes the
// next chunk of at most 64 tokens (chunked prefill) and a request past it
// decodes one token, all in one ragged call. Pages of 16 tokens come from a
// free list as the sequences grow, in whatever order they come back. Every
// step is checked, bit for bit, against the same attention over each
// request's keys and values copied into contiguous tensors.
//
//   K, V cache   pages [48, 16, 2, 64] bf16, a block table per request
//   Q            ragged [tokens of this step, 8, 64]: 8 query heads over 2
//   O            softmax(causal(Q Kᵀ / 8)) V, each request over its own keys
#include <qkv/qkv.hpp>

#include <cstdint>
#include <cstdio>
#include <vector>

using namespace qkv;

namespace {

constexpr std::size_t Hq = 8, Hk = 2, d = 64, page = 16, pages = 48, width = 10;  // at most 10 pages a request
constexpr std::size_t chunk = 64, steps = 12;

// Deterministic values in [−1, 1) for token t of request r (a stand-in for
// the projections of a model).
float value(std::size_t r, std::size_t t, std::size_t h, std::size_t c, std::size_t which) {
  std::uint32_t x = static_cast<std::uint32_t>(((r * 4096 + t) * 16 + h) * 128 + c) * 2654435761u + static_cast<std::uint32_t>(which) * 40503u;
  x ^= x >> 15, x *= 2246822519u, x ^= x >> 13;
  return static_cast<float>(x % 2048) / 1024.0f - 1.0f;
}

// Request r's first n keys (which = 1) or values (2) as a [1, Hk, n, d] tensor.
tensor<bf16, 1, Hk, dyn, d> dense_keys(std::size_t r, std::size_t n, std::size_t which) {
  tensor<bf16, 1, Hk, dyn, d> x(n);
  for (std::size_t t = 0; t < n; ++t)
    for (std::size_t h = 0; h < Hk; ++h)
      for (std::size_t c = 0; c < d; ++c) x(0, h, t, c) = bf16(value(r, t, h, c, which));
  return x;
}

}  // namespace

int main() {
  const std::vector<std::size_t> prompt{100, 7, 64, 33, 1, 120};
  const std::size_t B = prompt.size();
  std::vector<bf16> k_pool(pages * page * Hk * d), v_pool(k_pool.size());
  std::vector<std::int32_t> table(B * width, -1), lengths(B, 0), free_pages;
  for (std::size_t p = pages; p-- > 0;) free_pages.push_back(static_cast<std::int32_t>((p * 7) % pages));  // any order
  const matrix_view<const std::int32_t, dyn, dyn> block_table(table.data(), B, width);
  std::size_t checked = 0, differing = 0, prefill_tokens = 0, decode_tokens = 0;

  for (std::size_t step = 0; step < steps; ++step) {
    // This step's tokens: the next chunk of the prompt, or one decoded token.
    std::vector<std::int32_t> offsets{0};
    std::vector<std::size_t> first(B);
    for (std::size_t r = 0; r < B; ++r) {
      const std::size_t have = static_cast<std::size_t>(lengths[r]);
      const std::size_t n = have < prompt[r] ? std::min(chunk, prompt[r] - have) : 1;
      (have < prompt[r] ? prefill_tokens : decode_tokens) += n;
      first[r] = have;
      offsets.push_back(offsets.back() + static_cast<std::int32_t>(n));
      for (std::size_t k = have / page; k < (have + n + page - 1) / page; ++k)  // pages for the new rows
        if (table[r * width + k] < 0) table[r * width + k] = free_pages.back(), free_pages.pop_back();
    }
    ragged<float, Hq, d> q(offsets, {Hq, d});
    ragged<bf16, Hk, d> new_k(offsets, {Hk, d}), new_v(offsets, {Hk, d});
    for (std::size_t r = 0; r < B; ++r)
      for (std::size_t i = 0; i < q.length(r); ++i) {
        const std::size_t t = static_cast<std::size_t>(offsets[r]) + i, at = first[r] + i;
        for (std::size_t h = 0; h < Hq; ++h)
          for (std::size_t c = 0; c < d; ++c) q(t, h, c) = value(r, at, h, c, 0);
        for (std::size_t h = 0; h < Hk; ++h)
          for (std::size_t c = 0; c < d; ++c) new_k(t, h, c) = bf16(value(r, at, h, c, 1)), new_v(t, h, c) = bf16(value(r, at, h, c, 2));
      }
    // Append the new keys and values at each request's length, then attend.
    append(paged_view<bf16, Hk, d>(k_pool.data(), {pages, page, Hk, d}, block_table, lengths), new_k);
    append(paged_view<bf16, Hk, d>(v_pool.data(), {pages, page, Hk, d}, block_table, lengths), new_v);
    for (std::size_t r = 0; r < B; ++r) lengths[r] += static_cast<std::int32_t>(q.length(r));
    const paged_view<const bf16, Hk, d> K(k_pool.data(), {pages, page, Hk, d}, block_table, lengths);
    const paged_view<const bf16, Hk, d> V(v_pool.data(), {pages, page, Hk, d}, block_table, lengths);
    const ragged<float, Hq, d> O = eval(softmax(causal(q * transpose(K) / sqrt(dim<d>))) * V);

    // Each request alone, over contiguous copies of its keys and values.
    for (std::size_t r = 0; r < B; ++r) {
      const std::size_t n = q.length(r), m = static_cast<std::size_t>(lengths[r]);
      tensor<float, 1, Hq, dyn, d> qr(n);
      for (std::size_t i = 0; i < n; ++i)
        for (std::size_t h = 0; h < Hq; ++h)
          for (std::size_t c = 0; c < d; ++c) qr(0, h, i, c) = q(static_cast<std::size_t>(offsets[r]) + i, h, c);
      const auto want = eval(softmax(causal(qr * transpose(dense_keys(r, m, 1)) / sqrt(dim<d>))) * dense_keys(r, m, 2));
      for (std::size_t i = 0; i < n; ++i)
        for (std::size_t h = 0; h < Hq; ++h)
          for (std::size_t c = 0; c < d; ++c, ++checked)
            differing += O(static_cast<std::size_t>(offsets[r]) + i, h, c) != want(0, h, i, c);
    }
  }
  std::printf("%zu requests, %zu steps: %zu prompt tokens in chunks of up to %zu, %zu decoded; %zu pages of %zu in use\n",
              B, steps, prefill_tokens, chunk, decode_tokens, pages - free_pages.size(), page);
  std::printf("each step against contiguous copies: %zu of %zu values differ: %s\n", differing, checked,
              differing == 0 ? "bit for bit" : "MISMATCH");
  return differing == 0 ? 0 : 1;
}
