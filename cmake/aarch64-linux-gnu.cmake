# Cross-compiling for AArch64 (NEON) on an x86-64 Debian machine; CTest runs
# the binaries under qemu-aarch64. Needs g++-aarch64-linux-gnu and qemu-user.
set(CMAKE_SYSTEM_NAME Linux)
set(CMAKE_SYSTEM_PROCESSOR aarch64)
set(CMAKE_CXX_COMPILER aarch64-linux-gnu-g++)
set(CMAKE_CROSSCOMPILING_EMULATOR qemu-aarch64 -L /usr/aarch64-linux-gnu)
# The header-only packages (xsimd, Boost, Catch2) are found where the host has them.
list(APPEND CMAKE_PREFIX_PATH /usr/lib/x86_64-linux-gnu/cmake /usr/lib/cmake /usr/share/cmake)
