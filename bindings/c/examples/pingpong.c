/*
 * Two processes over the shared-memory driver, busy-polling: a PUT, FENCE,
 * GET ping-pong.
 *
 * The program runs itself twice: the first process (ping) forks and
 * re-executes itself as the second (pong), passing one end of a socket pair.
 * Each allocates a window and sends its address, key and window address to
 * the other. Then, for every round, ping PUTs a sequence number into pong's
 * window, FENCEs, and GETs it back (the GET must see the PUT); pong spins on
 * its window until the number arrives and PUTs it into ping's window; ping
 * spins until it sees it. Neither side calls into the library per
 * operation except rf_progress: SQEs and CQEs go through the inline helpers.
 *
 *   cargo build --release -p ringfence-c
 *   cc -O2 bindings/c/examples/pingpong.c $(pkg-config --cflags --libs ringfence) -o pingpong
 *   ./pingpong [rounds]
 */
#define _GNU_SOURCE
#include "common.h"

#include <inttypes.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

/* A peer, as this process sees it. */
struct side {
    rf_worker_t worker;
    struct rf_ring ring;
    uint64_t *window; /* ours: the peer PUTs into it */
    uint32_t window_mem;
    uint64_t *scratch; /* ours: PUT source, GET destination */
    uint32_t scratch_mem;
    uint32_t ep, rkey; /* the peer's window */
    uint64_t remote;
};

/* Creates the worker, ring and memory, and swaps window offers with the
   peer on `fd`: address, key, window address. */
static void setup(struct side *s, int fd)
{
    struct rf_worker_config config;
    TRY(rf_worker_config_init(&config));
    config.drivers = "shm";
    TRY(rf_worker_create(&config, &s->worker));
    TRY(rf_ring_create(s->worker, 0, 0, &s->ring));
    TRY(rf_mem_alloc(s->worker, 4096, (void **)&s->window, &s->window_mem));
    TRY(rf_mem_alloc(s->worker, 4096, (void **)&s->scratch, &s->scratch_mem));

    send_offer(fd, s->worker, s->window_mem, s->window);
    take_offer(fd, s->worker, &s->ep, &s->rkey, &s->remote);
}

static void teardown(struct side *s)
{
    TRY(rf_ring_destroy(&s->ring));
    TRY(rf_worker_destroy(s->worker)); /* frees the windows too */
}

/* Spins (yielding after a while, for machines with fewer cores than
   processes) until the 8-byte word at `p` is no longer `old`; returns it. */
static uint64_t spin_while(struct side *s, uint64_t *p, uint64_t old)
{
    uint64_t now;
    for (uint64_t spins = 0; (now = __atomic_load_n(p, __ATOMIC_ACQUIRE)) == old; spins++) {
        if (spins % 1024 == 1023) {
            rf_progress(s->worker);
            sched_yield();
        }
    }
    return now;
}

/* PUTs `value` into the peer's window, skipping its CQE on success. */
static void put_value(struct side *s, uint64_t value)
{
    s->scratch[0] = value;
    struct rf_sqe *sqe = rf_get_sqe(&s->ring);
    if (sqe == NULL)
        exit(1);
    rf_prep_put(sqe, s->ep, &s->scratch[0], s->scratch_mem, s->remote, s->rkey, 8);
    rf_sqe_set_flags(sqe, RF_SQE_SKIP_SUCCESS);
}

/* Runs progress until the next CQE; returns it (copied). */
static struct rf_cqe next_cqe(struct side *s)
{
    struct rf_cqe *cqe;
    while (rf_peek_cqe(&s->ring, &cqe) != 0)
        rf_progress(s->worker);
    struct rf_cqe copy = *cqe;
    rf_cqe_seen(&s->ring, cqe);
    return copy;
}

static int pong(int fd)
{
    struct side s;
    setup(&s, fd);
    for (uint64_t last = 0;;) {
        uint64_t got = last = spin_while(&s, s.window, last);
        put_value(&s, got);
        rf_submit(&s.ring);
        rf_progress(s.worker);
        if (got == UINT64_MAX)
            break;
    }
    teardown(&s);
    return 0;
}

static int ping(int fd, uint64_t rounds)
{
    struct side s;
    setup(&s, fd);
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    for (uint64_t seq = 1; seq <= rounds; seq++) {
        uint64_t value = seq == rounds ? UINT64_MAX : seq;
        put_value(&s, value);
        struct rf_sqe *sqe = rf_get_sqe(&s.ring);
        rf_prep_fence(sqe, s.ep, RF_FENCE_COMPLETE);
        rf_sqe_set_flags(sqe, RF_SQE_SKIP_SUCCESS);
        sqe = rf_get_sqe(&s.ring);
        rf_prep_get(sqe, s.ep, &s.scratch[1], s.scratch_mem, s.remote, s.rkey, 8);
        rf_sqe_set_data(sqe, seq);
        rf_submit(&s.ring);
        struct rf_cqe c = next_cqe(&s);
        if (c.res != 8 || c.user_data != seq || s.scratch[1] != value) {
            fprintf(stderr, "round %" PRIu64 ": GET returned %d, read %" PRIu64 "\n", seq,
                    c.res, s.scratch[1]);
            return 1;
        }
        if (spin_while(&s, s.window, seq - 1) != value) {
            fprintf(stderr, "round %" PRIu64 ": a wrong answer\n", seq);
            return 1;
        }
    }
    clock_gettime(CLOCK_MONOTONIC, &t1);
    double ns = (double)(t1.tv_sec - t0.tv_sec) * 1e9 + (double)(t1.tv_nsec - t0.tv_nsec);
    printf("pingpong: %" PRIu64 " rounds of PUT+FENCE+GET and an answer PUT, %.0f ns per round "
           "trip\n",
           rounds, ns / (double)rounds);
    teardown(&s);
    return 0;
}

int main(int argc, char **argv)
{
    if (argc == 3 && strcmp(argv[1], "pong") == 0)
        return pong(atoi(argv[2]));
    uint64_t rounds = argc > 1 ? strtoull(argv[1], NULL, 10) : 100000;
    if (rounds == 0)
        rounds = 1;
    int fd;
    pid_t child = spawn_peer(argv[0], "pong", &fd);
    if (child < 0)
        return 1;
    int rc = ping(fd, rounds);
    int status = 0;
    waitpid(child, &status, 0);
    return rc != 0 || !WIFEXITED(status) || WEXITSTATUS(status) != 0;
}
