// The main of qkv::mpi's tests (mpi_test.cpp), run by every rank under
// mpirun: a rank fails the run when any rank fails. Only rank 0 prints a
// passing run; every rank prints its failures.
#include "catch_session.hpp"

#include <mpi.h>

#include <cstdio>

int main(int argc, char* argv[]) {
  MPI_Init(&argc, &argv);
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  const int failed = test::run_catch(argc, argv);
  int any = 0;
  MPI_Allreduce(&failed, &any, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  if (rank == 0 && any == 0) std::printf("every rank passed\n");
  MPI_Finalize();
  return failed != 0 ? 1 : 0;
}
