#!/usr/bin/env bash
# Leak check of burn-mlx's native layer (MLX, mlx-c, mlx-rs and our FFI) on a short training run.
#
# It builds the memory test binary (tests/process/memory.rs: the 784-512-512-10 MLP trained with
# Autodiff<Mlx> + Adam) and runs its `training_memory_is_stable` test for $STEPS steps
#   1. under LeakSanitizer, preloading GCC's liblsan into the ordinary (non-instrumented) binary
#      (Debian: `apt-get install liblsan0`), and
#   2. under valgrind memcheck with --leak-check=full (Debian: `apt-get install valgrind`),
# then prints each tool's leak summary. It exits 1 when either tool finds memory that is
# definitely lost, 0 otherwise. Memory still reachable at exit (MLX's buffer cache, its
# thread pools, Burn's global device registry) is not a leak and is not reported. Valgrind's
# "possibly lost" blocks are listed by the crate or library of their allocating frame, for a
# human to read: Rust's Arc/Box interior pointers make valgrind unsure about live objects.
#
# Usage: scripts/leak_check.sh            (from the repository root)
#   STEPS=60         training steps (at least 50: the test's warm-up)
#   VALGRIND=0       skip valgrind (it runs the model about 100x slower: ~2 s a step)
#   LSAN=0           skip LeakSanitizer
#   OUT=dir          where the full reports go (default: target/leak-check)
set -euo pipefail
cd "$(dirname "$0")/.."

STEPS=${STEPS:-60}
OUT=${OUT:-target/leak-check}
mkdir -p "$OUT"
status=0

echo "== building the memory test binary"
bin=$(cargo test -j 2 --test memory --no-run 2>&1 | tee "$OUT/build.log" |
    sed -n 's/.*Executable tests\/memory.rs (\(.*\))/\1/p' | tail -1)
if [[ -z "$bin" || ! -x "$bin" ]]; then
    echo "could not build the memory test (see $OUT/build.log)" >&2
    exit 2
fi
echo "   $bin"
export BURN_MLX_MEMORY_STEPS=$STEPS
args=(--exact training_memory_is_stable --test-threads=1 --nocapture)

if [[ ${LSAN:-1} != 0 ]]; then
    lsan=$(ldconfig -p | sed -n 's/.*liblsan\.so\.0 .*=> \(.*\)/\1/p' | head -1)
    if [[ -z "$lsan" ]]; then
        echo "== LeakSanitizer: liblsan.so.0 not found (apt-get install liblsan0): skipped"
    else
        echo "== LeakSanitizer ($lsan), $STEPS steps"
        LD_PRELOAD=$lsan LSAN_OPTIONS=exitcode=23:print_suppressions=0 \
            "$bin" "${args[@]}" >"$OUT/lsan.txt" 2>&1 && rc=0 || rc=$?
        grep -oE "memory: .*|test result.*" "$OUT/lsan.txt" | sed 's/^/   /' || true
        if grep -q "SUMMARY: LeakSanitizer" "$OUT/lsan.txt"; then
            grep "SUMMARY: LeakSanitizer" "$OUT/lsan.txt" | sed 's/^/   /'
            echo "   direct leaks: $(grep -c '^Direct leak' "$OUT/lsan.txt")," \
                "indirect: $(grep -c '^Indirect leak' "$OUT/lsan.txt") (stacks in $OUT/lsan.txt)"
            status=1
        elif [[ $rc != 0 ]]; then
            echo "   the run failed (exit $rc): see $OUT/lsan.txt"
            status=1
        else
            echo "   LeakSanitizer: no leaks (0 bytes in 0 allocations)"
        fi
    fi
fi

if [[ ${VALGRIND:-1} != 0 ]]; then
    if ! command -v valgrind >/dev/null; then
        echo "== valgrind: not installed (apt-get install valgrind): skipped"
    else
        echo "== valgrind memcheck, $STEPS steps (slow)"
        supp=()
        [[ -f scripts/valgrind.supp ]] && supp=(--suppressions=scripts/valgrind.supp)
        OPENBLAS_NUM_THREADS=1 valgrind --leak-check=full \
            --show-leak-kinds=definite,indirect,possible --errors-for-leak-kinds=definite \
            --num-callers=40 --error-exitcode=23 "${supp[@]}" --log-file="$OUT/valgrind.txt" \
            "$bin" "${args[@]}" >"$OUT/valgrind-run.txt" 2>&1 && rc=0 || rc=$?
        grep -oE "memory: .*|test result.*" "$OUT/valgrind-run.txt" | sed 's/^/   /' || true
        sed -n '/LEAK SUMMARY/,/suppressed/p' "$OUT/valgrind.txt" | sed 's/^==[0-9]*==/  /'
        grep "ERROR SUMMARY" "$OUT/valgrind.txt" | sed 's/^==[0-9]*==/  /'
        # Where the "possibly lost" blocks were allocated: the first frame of each record that
        # is not the allocator, std or alloc.
        echo "   possibly lost, by allocating frame:"
        awk '/are possibly lost/{on=1; next}
             on && /(by|at) 0x/ && !/malloc|calloc|realloc|alloc::|library\/(alloc|core|std)|operator new/ {
                 sub(/.*: /, ""); print substr($0, 1, 100); on=0 }
             /^==[0-9]+== $/{on=0}' "$OUT/valgrind.txt" | sort | uniq -c | sort -rn | head -12 |
            sed 's/^/     /'
        definite=$(sed -n 's/.*definitely lost: \([0-9,]*\) bytes.*/\1/p' "$OUT/valgrind.txt" |
            tr -d , | tail -1)
        if [[ -z "$definite" ]]; then
            echo "   valgrind printed no leak summary: see $OUT/valgrind.txt"
            status=1
        elif [[ "$definite" != 0 ]]; then
            echo "   valgrind: $definite bytes definitely lost (stacks in $OUT/valgrind.txt)"
            status=1
        elif ! grep -q "test result: ok" "$OUT/valgrind-run.txt"; then
            echo "   the run failed: see $OUT/valgrind-run.txt"
            status=1
        fi
    fi
fi
exit $status
