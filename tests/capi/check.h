/* What the plain-C tests of the C API share: the table they call through, a failure count, a
 * CHECK that counts and goes on, and ok() that ends the test on an unexpected status. One
 * translation unit per test program, so the statics are that program's. */
#ifndef KILN_TESTS_CAPI_CHECK_H_
#define KILN_TESTS_CAPI_CHECK_H_

#include <kiln/kiln.h>
#include <stdio.h>
#include <stdlib.h>

static const kiln_api* api;
static int failures;

#define CHECK(cond)                                                            \
  do {                                                                         \
    if (!(cond)) {                                                             \
      fprintf(stderr, "%s:%d: CHECK failed: %s\n", __FILE__, __LINE__, #cond); \
      ++failures;                                                              \
    }                                                                          \
  } while (0)

/* Fails the test with the status's message when it is not NULL. */
static void ok(kiln_status* s, const char* what) {
  if (s != NULL) {
    fprintf(stderr, "%s: error %d: %s\n", what, api->status_code(s), api->status_message(s));
    api->status_release(s);
    exit(1);
  }
}

#endif /* KILN_TESTS_CAPI_CHECK_H_ */
