// FuzzCheck: how a fuzz target states an invariant the code under test documents (a status code,
// a round trip, a shape). A broken invariant aborts, which libFuzzer reports as a crash and saves
// as a reproducer, exactly like a sanitizer report.
#ifndef ATTNSERVE_TESTS_FUZZ_FUZZ_CHECK_H_
#define ATTNSERVE_TESTS_FUZZ_FUZZ_CHECK_H_

#include <cstdio>
#include <cstdlib>
#include <string>

#include "absl/status/status.h"

namespace attnserve::fuzz {

// Aborts with `what` (and `status`, when given) on stderr unless `ok`.
inline void FuzzCheck(bool ok, const std::string& what,
                      const absl::Status& status = absl::OkStatus()) {
  if (ok) return;
  std::fprintf(stderr, "FuzzCheck failed: %s%s%s\n", what.c_str(), status.ok() ? "" : ": ",
               status.ok() ? "" : status.ToString().c_str());
  std::abort();
}

}  // namespace attnserve::fuzz

#endif  // ATTNSERVE_TESTS_FUZZ_FUZZ_CHECK_H_
