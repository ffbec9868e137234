/*
 * Unit tests of the debug assertions (base/dassert.h) on lock preconditions: a `*_locked`
 * function called without the store lock kills the process with SIGABRT and says where and
 * what. Each case runs in a forked child whose stderr goes to a file the test reads back.
 *
 * Only an asserting build (DEBUG=1, ASAN=1, UBSAN=1) has the assertions; in a release build
 * every test here reports itself skipped, not passed.
 */
#include "base/dassert.h"
#include "core/store.h"
#include "shm/changelog.h"
#include "store_fixture.h"

#include <criterion/criterion.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#define SKIP_UNLESS_ASSERTING() \
    do { \
        if (!KVR_DASSERTS_ON) \
            cr_skip_test("debug assertions are off in this build (release): build with DEBUG=1, " \
                         "ASAN=1 or UBSAN=1 to run it"); \
    } while (0)

typedef void (*case_fn)(fx_t *f);

/*
 * Runs fn(f) in a forked child with stderr captured into msg. Returns the child's wait status.
 * The child exits 0 when fn returns: an assertion that does not fire shows as a clean exit.
 */
static int run_child(fx_t *f, case_fn fn, char *msg, size_t n)
{
    char tmpl[] = "/tmp/kvr-unit-dassert-XXXXXX";
    int fd = mkstemp(tmpl), status;
    ssize_t got;
    pid_t pid;

    cr_assert_geq(fd, 0);
    unlink(tmpl);
    pid = fork();
    cr_assert_geq(pid, 0);
    if (pid == 0) {
        dup2(fd, STDERR_FILENO);
        kvr_log_set_role("dassert-child");
        fn(f);
        _exit(0);
    }
    cr_assert_eq(waitpid(pid, &status, 0), pid);
    got = pread(fd, msg, n - 1, 0);
    msg[got > 0 ? got : 0] = '\0';
    close(fd);
    return status;
}

/* The child died of SIGABRT and printed "file:line: assertion failed: expr" naming where. */
static void expect_trip(int status, const char *msg, const char *where, const char *expr)
{
    cr_assert(WIFSIGNALED(status) && WTERMSIG(status) == SIGABRT,
              "the child must die of SIGABRT (status %#x), it said: %s", status, msg);
    cr_assert(strstr(msg, where) != NULL && strstr(msg, "assertion failed: ") != NULL &&
                  strstr(msg, expr) != NULL,
              "the message names %s and `%s`: %s", where, expr, msg);
    cr_log_info("tripped as expected: %s", msg);
}

static void arena_alloc_unlocked(fx_t *f)
{
    (void)kvr_arena_alloc_locked(&f->st.arena, 1);
}

static void index_alloc_unlocked(fx_t *f)
{
    (void)kvr_index_entry_alloc_locked(&f->st.ix);
}

static void chlog_append_unlocked(fx_t *f)
{
    (void)kvr_chlog_append_locked(f->st.log, &f->st.sh->lock, KVR_EV_INSERT, 1, 1, 1, 0);
}

static void unlock_unheld(fx_t *f)
{
    kvr_shlock_unlock(&f->st.sh->lock);
}

/* The control: the same calls with the lock held do not trip. */
static void arena_alloc_locked_ok(fx_t *f)
{
    int dead;
    uint32_t head;

    if (kvr_shlock_lock(&f->st.sh->lock, f->st.slot, &dead) != KVR_OK)
        _exit(3);
    head = kvr_arena_alloc_locked(&f->st.arena, 1);
    if (head == KVR_NIL)
        _exit(4);
    kvr_arena_free_locked(&f->st.arena, head);
    (void)kvr_chlog_append_locked(f->st.log, &f->st.sh->lock, KVR_EV_INSERT, 1, 1, 1, 0);
    kvr_shlock_unlock(&f->st.sh->lock);
}

Test(dassert, a_locked_function_without_the_lock_aborts_naming_the_precondition)
{
    fx_t f;
    char msg[1024];

    SKIP_UNLESS_ASSERTING();
    fx_open(&f, 1 << 20, 4096, 0, 0);
    expect_trip(run_child(&f, arena_alloc_unlocked, msg, sizeof(msg)), msg, "src/shm/arena.c:",
                "arena_locked(a)");
    expect_trip(run_child(&f, index_alloc_unlocked, msg, sizeof(msg)), msg, "src/shm/index.c:",
                "index_locked(ix)");
    expect_trip(run_child(&f, chlog_append_unlocked, msg, sizeof(msg)), msg, "src/shm/changelog.c:",
                "kvr_shlock_held(lock)");
    expect_trip(run_child(&f, unlock_unheld, msg, sizeof(msg)), msg, "src/shm/shlock.c:", "kvr_shlock_held(l)");
    cr_assert_eq(run_child(&f, arena_alloc_locked_ok, msg, sizeof(msg)), 0, "with the lock held: %s", msg);
    cr_assert_eq(kvr_store_check(&f.st, NULL), KVR_OK);
    fx_close(&f);
}

/* A forked child does not hold its parent's lock (the mutex's owner is the parent's thread):
 * the held-lock record is cleared at fork, and the child's _locked call trips. */
Test(dassert, a_forked_child_of_the_holder_does_not_hold_the_lock)
{
    fx_t f;
    char msg[1024];
    int dead;

    SKIP_UNLESS_ASSERTING();
    fx_open(&f, 1 << 20, 4096, 0, 0);
    cr_assert_eq(kvr_shlock_lock(&f.st.sh->lock, f.st.slot, &dead), KVR_OK);
    cr_assert(kvr_shlock_held(&f.st.sh->lock));
    expect_trip(run_child(&f, index_alloc_unlocked, msg, sizeof(msg)), msg, "src/shm/index.c:",
                "index_locked(ix)");
    kvr_shlock_unlock(&f.st.sh->lock);
    cr_assert(!kvr_shlock_held(&f.st.sh->lock));
    fx_close(&f);
}
