/*
 * dassert.h — debug assertions of preconditions: KVR_DASSERT(expr).
 *
 * Compiled in when the build defines KVR_DEBUG_ASSERTS (mk/build.mk does for DEBUG=1, ASAN=1
 * and UBSAN=1); a release build compiles the expression for its types but never evaluates it,
 * so an assertion costs nothing there and may call functions that exist only to be asserted
 * (kvr_shlock_held). A failed assertion prints "file:line: assertion failed: expr" with the
 * process's role and pid on stderr and aborts: the process dies of SIGABRT, and the supervisor
 * repairs and replaces it like any other crash.
 *
 * What they are for: the rules of docs/concurrency.md that a caller can break without any
 * test noticing at once — a `*_locked` function called without the store lock, a shared
 * object written by a process that is not its owner. Like SQLite's assert(mutex_held(...))
 * at the top of every function that needs a mutex: the rule is in the code, next to the
 * function that relies on it, and every debug and sanitizer test run checks it.
 *
 * KVR_DASSERTS_ON is 1 in an asserting build, so that a test of an assertion can say it is
 * skipped elsewhere.
 */
#ifndef KVR_BASE_DASSERT_H
#define KVR_BASE_DASSERT_H

__attribute__((noreturn, cold)) void kvr_dassert_fail(const char *file, int line, const char *expr);

/* Marks a helper that exists for assertions: a release build references it only inside
 * sizeof, where compilers (clang) would otherwise call it unneeded. */
#define KVR_DASSERT_FN __attribute__((unused))

#ifdef KVR_DEBUG_ASSERTS
#define KVR_DASSERTS_ON 1
#define KVR_DASSERT(expr) \
    (__builtin_expect(!!(expr), 1) ? (void)0 : kvr_dassert_fail(__FILE__, __LINE__, #expr))
#else
#define KVR_DASSERTS_ON   0
#define KVR_DASSERT(expr) ((void)sizeof(!(expr)))
#endif

#endif
