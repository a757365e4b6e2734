/*
 * A small test harness for the C tests of libringfence: test cases run by
 * RFT_RUN, CHECK macros that fail the current case, a deadline for loops
 * that wait, and the closing line "test result: ok. N passed; M failed"
 * (N and M count cases) that scripts/test.sh adds up.
 */
#ifndef RFTEST_H
#define RFTEST_H

/* POSIX and Linux calls (clock_gettime, fork, epoll) under -std=c11. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif

#include <sched.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "ringfence.h"

static int rft_passed, rft_failed, rft_case_failed;

#define CHECK(cond)                                                                  \
    do {                                                                             \
        if (!(cond)) {                                                               \
            rft_case_failed = 1;                                                     \
            fprintf(stderr, "%s:%d: FAILED: %s\n", __FILE__, __LINE__, #cond);       \
        }                                                                            \
    } while (0)

/* An rf_* call's result equals the expected status (named in the output). */
#define CHECK_RC(call, want)                                                         \
    do {                                                                             \
        int rft_rc = (call);                                                         \
        if (rft_rc != (want)) {                                                      \
            rft_case_failed = 1;                                                     \
            fprintf(stderr, "%s:%d: FAILED: %s = %d (%s), want %d (%s)\n", __FILE__, \
                    __LINE__, #call, rft_rc, rf_strerror(rft_rc), (want),            \
                    rf_strerror(want));                                              \
        }                                                                            \
    } while (0)

/* A setup step that must succeed: stops the test if it does not. */
#define MUST(call)                                                                   \
    do {                                                                             \
        int rft_rc = (call);                                                         \
        if (rft_rc < 0) {                                                            \
            fprintf(stderr, "%s:%d: FAILED: %s = %d (%s)\n", __FILE__, __LINE__,     \
                    #call, rft_rc, rf_strerror(rft_rc));                             \
            exit(1);                                                                 \
        }                                                                            \
    } while (0)

static double rft_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* Waiting loops spin a little, then yield (two shared cores), and give up
   only after this long: the limit catches a hang, it never paces a test. */
#define RFT_HANG_SECONDS 60.0

static void rft_pause(uint64_t spins)
{
    if (spins > 64)
        sched_yield();
}

/* Runs progress and reaps until one CQE arrives; copies it out. */
static struct rf_cqe rft_one_cqe(rf_worker_t worker, struct rf_ring *ring)
{
    double deadline = rft_now() + RFT_HANG_SECONDS;
    for (uint64_t spins = 0;; spins++) {
        struct rf_cqe *cqe;
        if (worker != 0)
            rf_progress(worker);
        int rc = rf_peek_cqe(ring, &cqe);
        if (rc == 0) {
            struct rf_cqe copy = *cqe;
            rf_cqe_seen(ring, cqe);
            return copy;
        }
        if (rc != RF_EAGAIN || rft_now() > deadline) {
            fprintf(stderr, "no completion: %d (%s)\n", rc, rf_strerror(rc));
            exit(1);
        }
        rft_pause(spins);
    }
}

/* Gets an SQE, or stops the test. */
static struct rf_sqe *rft_sqe(struct rf_ring *ring)
{
    struct rf_sqe *sqe = rf_get_sqe(ring);
    if (sqe == NULL) {
        fprintf(stderr, "SQ full\n");
        exit(1);
    }
    return sqe;
}

/* Runs one test case and reports it. */
#define RFT_RUN(fn) rft_run(#fn, fn)
static void rft_run(const char *name, void (*fn)(void))
{
    rft_case_failed = 0;
    fn();
    if (rft_case_failed)
        rft_failed++;
    else
        rft_passed++;
    printf("test %s ... %s\n", name, rft_case_failed ? "FAILED" : "ok");
    fflush(stdout);
}

/* The closing line; the exit status says the same. */
static int rft_finish(const char *name)
{
    printf("%s: test result: %s. %d passed; %d failed\n", name, rft_failed ? "FAILED" : "ok",
           rft_passed, rft_failed);
    return rft_failed ? 1 : 0;
}

#endif
