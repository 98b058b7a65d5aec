// Causal attention over a sequence split across processes: run with
//   mpirun -np 4 ./ring_attention
// Each rank holds consecutive rows of Q, K and V (here a share of T = 3000
// tokens, which 4 does not divide) and gets its rows of the attention over
// the whole sequence; the K/V slices travel around the ring, and since it is
// causal the ranks compute on zig-zag chunks of the rows so that each does
// the same work (docs/distributed.md).
// To show that it is the same attention, every rank also computes the whole
// on its own and compares its rows.
#include <qkv/mpi.hpp>

#include <mpi.h>

#include <cmath>
#include <cstdio>
#include <random>
#include <vector>

using namespace qkv;

int main(int argc, char* argv[]) {
  MPI_Init(&argc, &argv);
  int rank = 0, ranks = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &ranks);

  constexpr std::size_t T = 3000, d = 64;
  // The whole sequence, the same on every rank (one seed).
  std::mt19937 gen(42);
  std::uniform_real_distribution<float> u(-1, 1);
  matrix<float, dyn, d> Q(T, d), K(T, d), V(T, d);
  for (auto* m : {&Q, &K, &V})
    for (std::size_t i = 0; i < T; ++i)
      for (std::size_t c = 0; c < d; ++c) (*m)(i, c) = u(gen);

  // This rank's rows [r0, r1): views into the whole, as a real program would
  // hold only them.
  const std::size_t r0 = T * rank / ranks, r1 = T * (rank + 1) / ranks, n = r1 - r0;
  const matrix_view<const float, dyn, d> Ql(&Q(r0, 0), n, d, d), Kl(&K(r0, 0), n, d, d), Vl(&V(r0, 0), n, d, d);

  const double t0 = MPI_Wtime();
  auto O = qkv::mpi::eval(softmax(causal(Ql * transpose(Kl) / sqrt(dim<d>))) * Vl, MPI_COMM_WORLD);
  const double seconds = MPI_Wtime() - t0;

  // The same rows from one process's attention over the whole sequence.
  const auto whole = eval(softmax(causal(Q * transpose(K) / sqrt(dim<d>))) * V);
  double worst = 0;
  for (std::size_t i = 0; i < n; ++i)
    for (std::size_t c = 0; c < d; ++c) worst = std::fmax(worst, std::fabs(double(O(i, c)) - double(whole(r0 + i, c))));
  double all = 0, slowest = 0;
  MPI_Reduce(&worst, &all, 1, MPI_DOUBLE, MPI_MAX, 0, MPI_COMM_WORLD);
  MPI_Reduce(&seconds, &slowest, 1, MPI_DOUBLE, MPI_MAX, 0, MPI_COMM_WORLD);
  std::printf("rank %d of %d: rows [%zu, %zu)\n", rank, ranks, r0, r1);
  MPI_Barrier(MPI_COMM_WORLD);
  if (rank == 0) {
    // P merges of partial results in float: a few units of roundoff (tests/mpi_test.cpp argues the bound).
    std::printf("%d ranks, %zu tokens, d = %zu, causal: %.1f ms; worst difference from one process: %.2g: %s\n", ranks, T,
                d, 1e3 * slowest, all, all < 1e-5 ? "ok" : "TOO LARGE");
  }
  MPI_Finalize();
  return all < 1e-5 || rank != 0 ? 0 : 1;
}
