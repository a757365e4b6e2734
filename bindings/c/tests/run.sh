#!/usr/bin/env bash
# Builds libringfence and runs the C tests against it:
#
# - the library exports only the rf_* functions that ringfence.h declares,
#   and ringfence.pc (pkg-config) builds a program;
# - the tests in this folder, built with gcc -std=c11 -Wall -Wextra -Werror
#   (g++ -std=c++17 for the C++ check) under AddressSanitizer and
#   UndefinedBehaviorSanitizer, linked to the shared library, and one of
#   them again to the static library;
# - the examples, built with pkg-config's flags, run briefly; README.md's C
#   example is examples/readme.c, and the two must be identical.
#
# Each test program prints "test <case> ... ok" lines and a closing
# "<program>: test result: ok. N passed; M failed" line, which
# scripts/test.sh adds to its count. Exits non-zero if anything fails.
#
#   bindings/c/tests/run.sh            debug build of the library
#   RINGFENCE_C_PROFILE=release ...    release build
set -euo pipefail
cd "$(dirname "$0")/../../.."

profile=${RINGFENCE_C_PROFILE:-debug}
libdir=$PWD/target/$profile
build=$PWD/target/c-tests
include=$PWD/bindings/c/include
mkdir -p "$build"

cargo_flags=(--locked)
[ "$profile" = release ] && cargo_flags+=(--release)
cargo build -p ringfence-c "${cargo_flags[@]}"

failed=() passed=0
check() { # name command...: one build check, reported like a test case
  local name=$1; shift
  if "$@"; then
    echo "test $name ... ok"; passed=$((passed + 1))
  else
    echo "test $name ... FAILED"; failed+=("$name")
  fi
}

# ------------------------------------------------------------ the library
exports_are_the_declared_functions() {
  local exported declared
  exported=$(nm -D --defined-only "$libdir/libringfence.so" | awk '{print $3}' | sort)
  declared=$(grep -oE '^(int |uint32_t |const char \*)rf_[a-z0-9_]+\(' "$include/ringfence.h" \
    | grep -oE 'rf_[a-z0-9_]+' | sort)
  if [ "$exported" != "$declared" ]; then
    echo "exported symbols differ from ringfence.h's functions:"
    diff <(echo "$declared") <(echo "$exported") || true
    return 1
  fi
}
check exports_are_the_declared_functions exports_are_the_declared_functions

export PKG_CONFIG_PATH=$libdir${PKG_CONFIG_PATH:+:$PKG_CONFIG_PATH}
pc_flags() { pkg-config --cflags --libs ringfence; }
check pkg_config_knows_ringfence pc_flags

# ------------------------------------------------------------ the tests
sanitize=(-g -O1 -fsanitize=address,undefined -fno-sanitize-recover=all -fno-omit-frame-pointer)
cflags=(-std=c11 -Wall -Wextra -Werror -pedantic "${sanitize[@]}" -I"$include")
cxxflags=(-std=c++17 -Wall -Wextra -Werror -pedantic "${sanitize[@]}" -I"$include")
link=(-L"$libdir" -Wl,-rpath,"$libdir" -lringfence)
static_link=("$libdir/libringfence.a" $(pkg-config --static --libs-only-l ringfence | sed 's/-lringfence//'))

# Leaks are checked (the library must free what it allocates, workers and
# memory from rf_mem_alloc included). Allocation failures return NULL as in
# production, so that a huge rf_mem_alloc is an error, not an ASan abort.
export ASAN_OPTIONS=detect_leaks=1:allocator_may_return_null=1:abort_on_error=0
export UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1

programs=()
compile() { # name compiler flags...
  local name=$1; shift
  check "compile_$name" "$@" -o "$build/$name"
  programs+=("$name")
}
for src in bindings/c/tests/*.c; do
  name=$(basename "$src" .c)
  compile "$name" gcc "${cflags[@]}" "$src" "${link[@]}"
done
compile cxx_header g++ "${cxxflags[@]}" bindings/c/tests/cxx_header.cpp "${link[@]}"
compile ring_static gcc "${cflags[@]}" bindings/c/tests/ring.c "${static_link[@]}"

for name in "${programs[@]}"; do
  [ -x "$build/$name" ] || continue
  echo "-- $name"
  if ! timeout 600 "$build/$name"; then
    echo "$name: FAILED"
    failed+=("$name")
  fi
done

# ------------------------------------------------------------ the examples
example() { # name args...: built as a user would, run briefly
  local name=$1; shift
  gcc -std=c11 -O2 -Wall -Wextra -Werror "bindings/c/examples/$name.c" $(pc_flags) \
    -o "$build/$name" && timeout 300 "$build/$name" "$@"
}
# README.md's one ```c block, between its fence lines, is examples/readme.c.
readme_c_block_is_examples_readme() {
  [ "$(grep -c '^```c$' README.md)" = 1 ] || { echo "README.md: expected one \`\`\`c block"; return 1; }
  diff -u bindings/c/examples/readme.c \
    <(awk '/^```c$/ { inside = 1; next } inside && /^```$/ { exit } inside' README.md)
}
check readme_c_block_is_examples_readme readme_c_block_is_examples_readme
check example_readme example readme
check example_pingpong example pingpong 2000
check example_epoll_client example epoll_client 200

echo "c-build-checks: test result: $([ ${#failed[@]} -eq 0 ] && echo ok || echo FAILED). $passed passed; ${#failed[@]} failed"
if [ ${#failed[@]} -ne 0 ]; then
  echo "C tests: FAILED: ${failed[*]}"
  exit 1
fi
echo "C tests: all passed"
