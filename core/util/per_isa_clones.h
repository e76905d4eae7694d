// ATTNSERVE_PER_ISA_CLONES: put before a function definition to compile it once per x86 ISA level
// (AVX-512; x86-64-v3, i.e. AVX2 with FMA; baseline) and pick the best at load time (GCC/Clang
// function multi-versioning). The middle level is x86-64-v3 rather than "avx2", which leaves out
// FMA (every AVX2 CPU since Haswell and Zen has it): with it the AVX2 softmax runs 1.2-1.4x and
// the int8 decode kernel 1.1-1.8x faster.
//
// The project builds for baseline x86-64 (SSE2); short vectorised loops that are bandwidth- or
// exp-bound only reach the machine's speed on its full vector width. ThreadSanitizer instruments
// the clone resolver, which the dynamic loader runs before the TSan runtime exists (it crashed
// test discovery), so TSan builds keep the single baseline version; so does a library that defines
// ATTNSERVE_SINGLE_ISA_VERSION (the KV-cache kernels in the fuzz build, which no fuzzer runs: with
// the fuzzers' instrumentation their three versions took 4.4 minutes to compile).
//
// Put it only on internal functions with no earlier declaration, and let the public function (the
// one its header declares) call the clones: Clang 14 compiles a target_clones function that was
// declared before without the attribute as one AVX-512 function with no dispatch (SIGILL on AVX2
// CPUs), and its calls from other files to a declaration that carries the attribute go to the
// resolver instead of a clone. GCC handles both; tests/layering checks that no header names a
// cloned function.
#ifndef ATTNSERVE_CORE_UTIL_PER_ISA_CLONES_H_
#define ATTNSERVE_CORE_UTIL_PER_ISA_CLONES_H_

#if defined(__SANITIZE_THREAD__) || defined(ATTNSERVE_SINGLE_ISA_VERSION)
#define ATTNSERVE_PER_ISA_CLONES
#else
#define ATTNSERVE_PER_ISA_CLONES \
  __attribute__((target_clones("avx512f", "arch=x86-64-v3", "default")))
#endif

#endif  // ATTNSERVE_CORE_UTIL_PER_ISA_CLONES_H_
