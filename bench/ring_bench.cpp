// Ring attention (qkv::mpi) against one process: run as
//   mpirun -np 1 --bind-to none ./ring_bench   one process, its kernels on 2 threads
//   mpirun -np 2 --bind-to none ./ring_bench   two processes, one thread each, the ring
// (OpenMPI binds each process to one core by default: a one-process run
// would then run its two threads on one core.)
// d = 64, T = 16384 and 32768, causal and not. Each iteration's time is the
// slowest rank's, after a barrier (manual time). The ring reports, per
// rank and call, the time spent computing, the time spent waiting for the
// transfers once the step's computation was done (what it did not hide),
// the bytes sent per step, and transfer_ms: the same transfers with no
// computation, so that hidden = 1 − wait / transfer; under causal,
// move_in_ms and move_out_ms: moving Q, K and V to the zig-zag assignment,
// and O and L back (which includes waiting for the last rank to finish).
// Only rank 0 reports.
#include <qkv/mpi.hpp>

#include <benchmark/benchmark.h>
#include <mpi.h>

#include <random>
#include <vector>

namespace {

using namespace qkv;
constexpr std::size_t d = 64;

int ranks() {
  int p = 1;
  MPI_Comm_size(MPI_COMM_WORLD, &p);
  return p;
}
int rank_of() {
  int r = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &r);
  return r;
}

matrix<float, dyn, d> random_rows(std::size_t n, unsigned seed) {
  matrix<float, dyn, d> m(n, d);
  std::mt19937 g(seed);
  std::uniform_real_distribution<float> u(-1, 1);
  for (std::size_t x = 0; x < m.size(); ++x) m.data()[x] = u(g);
  return m;
}

double slowest(double seconds) {
  double all = 0;
  MPI_Allreduce(&seconds, &all, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
  return all;
}

void ring(benchmark::State& state) {
  const std::size_t t = static_cast<std::size_t>(state.range(0));
  const bool causal_ = state.range(1) != 0;
  const int p = ranks(), r = rank_of();
  const std::size_t n = t * static_cast<std::size_t>(r + 1) / static_cast<std::size_t>(p) - t * static_cast<std::size_t>(r) / static_cast<std::size_t>(p);
  const auto q = random_rows(n, 1 + r), k = random_rows(n, 11 + r), v = random_rows(n, 21 + r);
  set_threads(1);
  mpi::detail::ring_profile prof;
  for (auto _ : state) {
    MPI_Barrier(MPI_COMM_WORLD);
    const double t0 = MPI_Wtime();
    if (causal_) benchmark::DoNotOptimize(mpi::detail::ring(softmax(causal(q * transpose(k) / sqrt(dim<d>))) * v, MPI_COMM_WORLD, &prof));
    else benchmark::DoNotOptimize(mpi::detail::ring(softmax(q * transpose(k) / sqrt(dim<d>)) * v, MPI_COMM_WORLD, &prof));
    state.SetIterationTime(slowest(MPI_Wtime() - t0));
  }
  // The same transfers alone: P − 1 steps of K and V around the ring.
  std::vector<float> kb(k.data(), k.data() + k.size()), vb(v.data(), v.data() + v.size()), kn = kb, vn = vb;
  MPI_Barrier(MPI_COMM_WORLD);
  const double t0 = MPI_Wtime();
  for (int s = 0; s + 1 < p; ++s) {
    std::vector<MPI_Request> reqs;
    mpi::detail::post_receive(kn, (r - 1 + p) % p, 0, MPI_COMM_WORLD, reqs);
    mpi::detail::post_receive(vn, (r - 1 + p) % p, 1, MPI_COMM_WORLD, reqs);
    mpi::detail::post_send(kb, (r + 1) % p, 0, MPI_COMM_WORLD, reqs);
    mpi::detail::post_send(vb, (r + 1) % p, 1, MPI_COMM_WORLD, reqs);
    MPI_Waitall(static_cast<int>(reqs.size()), reqs.data(), MPI_STATUSES_IGNORE);
  }
  const double transfer = slowest(MPI_Wtime() - t0);
  const double calls = static_cast<double>(state.iterations());
  state.counters["compute_ms"] = 1e3 * slowest(prof.compute_seconds) / calls;
  state.counters["wait_ms"] = 1e3 * slowest(prof.wait_seconds) / calls;
  state.counters["move_in_ms"] = 1e3 * slowest(prof.move_in_seconds) / calls;
  state.counters["move_out_ms"] = 1e3 * slowest(prof.move_out_seconds) / calls;
  state.counters["transfer_ms"] = 1e3 * transfer;
  // Of each call's steps, all but the last send.
  const double sending = double(prof.steps) - calls;
  state.counters["bytes_per_step"] = sending > 0 ? double(prof.bytes_sent) / sending : 0.0;
  state.counters["ranks"] = p;
}

void one_process(benchmark::State& state) {
  const std::size_t t = static_cast<std::size_t>(state.range(0));
  const bool causal_ = state.range(1) != 0;
  const auto q = random_rows(t, 1), k = random_rows(t, 11), v = random_rows(t, 21);
  set_threads(2);
  for (auto _ : state) {
    const double t0 = MPI_Wtime();
    if (causal_) benchmark::DoNotOptimize(eval(softmax(causal(q * transpose(k) / sqrt(dim<d>))) * v));
    else benchmark::DoNotOptimize(eval(softmax(q * transpose(k) / sqrt(dim<d>)) * v));
    state.SetIterationTime(MPI_Wtime() - t0);
  }
}

}  // namespace

int main(int argc, char* argv[]) {
  MPI_Init(&argc, &argv);
  benchmark::Initialize(&argc, argv);
  for (const long t : {16384L, 32768L})
    for (const long c : {0L, 1L}) {
      // Every rank runs the same iterations: the ring's collectives need it.
      benchmark::RegisterBenchmark("ring", ring)->Args({t, c})->Iterations(3)->UseManualTime()->Unit(benchmark::kMillisecond);
      if (ranks() == 1)
        benchmark::RegisterBenchmark("one_process_2_threads", one_process)->Args({t, c})->Iterations(3)->UseManualTime()->Unit(benchmark::kMillisecond);
    }
  if (rank_of() == 0) {
    benchmark::RunSpecifiedBenchmarks();
  } else {
    struct quiet : benchmark::BenchmarkReporter {
      bool ReportContext(const Context&) override { return true; }
      void ReportRuns(const std::vector<Run>&) override {}
    } none;
    benchmark::RunSpecifiedBenchmarks(&none);
  }
  benchmark::Shutdown();
  MPI_Finalize();
}
