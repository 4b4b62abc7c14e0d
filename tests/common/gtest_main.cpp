// Every test binary's main: GoogleTest's, and one listener. GoogleTest reports each test of a
// suite whose SetUpTestSuite failed (an oracle script that crashed) as skipped, and ctest takes
// the "[  SKIPPED ]" line for a skip whatever the exit status, so such a suite would pass. The
// listener ends the process with a failure when the first of those tests starts, before it is
// reported as skipped. A suite's own GTEST_SKIP() is not a failure and still skips.
#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>

namespace {

class FailedSuiteSetUpFails : public ::testing::EmptyTestEventListener {
  void OnTestStart(const ::testing::TestInfo& test) override {
    const ::testing::TestSuite* suite = ::testing::UnitTest::GetInstance()->current_test_suite();
    if (suite == nullptr || !suite->ad_hoc_test_result().Failed()) return;
    std::fprintf(stderr, "%s.%s: FAILED: the suite's SetUpTestSuite failed (above)\n",
                 test.test_suite_name(), test.name());
    std::fflush(nullptr);
    std::_Exit(1);
  }
};

}  // namespace

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  ::testing::UnitTest::GetInstance()->listeners().Append(new FailedSuiteSetUpFails);
  return RUN_ALL_TESTS();
}
