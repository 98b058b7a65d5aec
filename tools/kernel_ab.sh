#!/bin/sh
# The fused attention kernel of a commit against the working tree's, timed in
# one process (bench/kernel_ab.cpp says how, and what it prints):
#   tools/kernel_ab.sh REV [rounds] [T d causal]...
#   QKV_AB_FLAGS='-O2 -march=native' tools/kernel_ab.sh HEAD    # other flags
#   QKV_AB_PAIRS=1 tools/kernel_ab.sh HEAD    # the bf16-pair prefill, on AVX512-BF16
# It compiles REV's headers in namespace qkv_base beside the working tree's,
# with g++ and xsimd as the build uses them (-O3 -march=native by default).
set -eu
root=$(cd "$(dirname "$0")/.." && pwd)
rev=${1:?usage: tools/kernel_ab.sh REV [rounds] [T d causal]...}
shift
git -C "$root" rev-parse --verify --quiet "$rev^{commit}" > /dev/null || { echo "kernel_ab: no commit $rev" >&2; exit 1; }
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
git -C "$root" archive "$rev" include | tar -x -C "$work"
[ -f "$work/include/qkv/kernels/attention.hpp" ] || { echo "kernel_ab: $rev has no fused attention kernel" >&2; exit 1; }
rename='s/\bqkv::/qkv_base::/g; s/namespace qkv\b/namespace qkv_base/g; s/\bkernel_ab_work\b/kernel_ab_base/g'
grep -rl qkv "$work/include" | xargs sed -i "$rename"
sed "$rename" "$root/bench/kernel_ab_side.cpp" > "$work/base_side.cpp"
flags="-std=c++20 -DNDEBUG ${QKV_AB_FLAGS:--O3 -march=native}"
g++ $flags -I"$work/include" -I"$root/bench" -c "$work/base_side.cpp" -o "$work/base.o" &
base=$!
g++ $flags -I"$root/include" -I"$root/bench" -c "$root/bench/kernel_ab_side.cpp" -o "$work/work.o" &
ours=$!
g++ $flags -c "$root/bench/kernel_ab.cpp" -o "$work/main.o"
wait $base
wait $ours
g++ "$work/main.o" "$work/base.o" "$work/work.o" -o "$work/kernel_ab"
"$work/kernel_ab" "$@"
