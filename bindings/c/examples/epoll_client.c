/*
 * An epoll-driven client: the worker's core thread runs progress, and the
 * application thread sleeps in epoll_wait on its ring's CQ eventfd until
 * completions arrive, instead of polling.
 *
 * The program forks and re-executes itself as the target, a process that
 * offers a window over the shared-memory driver and then waits. The client
 * writes into that window in rounds: a few PUTs with SKIP_SUCCESS and a
 * FLUSH, then a GET that reads the last value back. Between submitting and
 * reaping it arms the CQ eventfd (rf_ring_cq_arm), sleeps in epoll_wait,
 * and disarms it (rf_ring_cq_disarm). rf_submit wakes the core thread when
 * it sleeps, so neither side spins while idle.
 *
 *   cargo build --release -p ringfence-c
 *   cc -O2 bindings/c/examples/epoll_client.c $(pkg-config --cflags --libs ringfence) -o epoll_client
 *   ./epoll_client [rounds]
 */
#define _GNU_SOURCE
#include "common.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

/* The target: a window, offered on `fd`; stays until the client hangs up. */
static int target(int fd)
{
    struct rf_worker_config config;
    TRY(rf_worker_config_init(&config));
    config.drivers = "shm";
    rf_worker_t w;
    TRY(rf_worker_create(&config, &w));
    void *window;
    uint32_t mem;
    TRY(rf_mem_alloc(w, 4096, &window, &mem));
    send_offer(fd, w, mem, window);
    char byte;
    while (read(fd, &byte, 1) > 0) {
    }
    TRY(rf_worker_destroy(w));
    return 0;
}

/* Sleeps in epoll until the ring has a CQE; returns it (copied). */
static struct rf_cqe wait_cqe(struct rf_ring *ring, int epfd, uint64_t *sleeps)
{
    struct rf_cqe *cqe;
    while (rf_peek_cqe(ring, &cqe) != 0) {
        /* 1: armed and the CQ is still empty, so sleep; 0: CQEs arrived
           meanwhile. */
        int armed = rf_ring_cq_arm(ring);
        TRY(armed);
        if (armed == 1) {
            struct epoll_event ev;
            if (epoll_wait(epfd, &ev, 1, -1) < 0)
                perror("epoll_wait");
            ++*sleeps;
        }
        TRY(rf_ring_cq_disarm(ring)); /* also clears the eventfd */
    }
    struct rf_cqe copy = *cqe;
    rf_cqe_seen(ring, cqe);
    return copy;
}

static int client(int fd, uint64_t rounds)
{
    struct rf_worker_config config;
    TRY(rf_worker_config_init(&config));
    config.drivers = "shm";
    config.core_thread = 1; /* progress runs there, not here */
    rf_worker_t w;
    TRY(rf_worker_create(&config, &w));
    struct rf_ring ring;
    TRY(rf_ring_create(w, 0, 0, &ring));
    uint64_t *buf;
    uint32_t buf_mem;
    TRY(rf_mem_alloc(w, 4096, (void **)&buf, &buf_mem));

    uint32_t ep, rkey;
    uint64_t remote;
    take_offer(fd, w, &ep, &rkey, &remote);

    int epfd = epoll_create1(EPOLL_CLOEXEC);
    struct epoll_event ev = {.events = EPOLLIN};
    if (epfd < 0 || epoll_ctl(epfd, EPOLL_CTL_ADD, rf_ring_cq_fd(&ring), &ev) != 0) {
        perror("epoll");
        return 1;
    }
    uint64_t sleeps = 0;
    for (uint64_t round = 1; round <= rounds; round++) {
        for (uint64_t i = 0; i < 8; i++) {
            buf[i] = round * 100 + i;
            struct rf_sqe *sqe = rf_get_sqe(&ring);
            rf_prep_put(sqe, ep, &buf[i], buf_mem, remote + 8 * i, rkey, 8);
            rf_sqe_set_flags(sqe, RF_SQE_SKIP_SUCCESS);
        }
        struct rf_sqe *sqe = rf_get_sqe(&ring);
        rf_prep_flush(sqe, ep);
        rf_sqe_set_data(sqe, 1);
        sqe = rf_get_sqe(&ring);
        rf_prep_get(sqe, ep, &buf[64], buf_mem, remote + 56, rkey, 8);
        rf_sqe_set_data(sqe, 2);
        TRY(rf_submit(&ring));
        struct rf_cqe flush = wait_cqe(&ring, epfd, &sleeps);
        struct rf_cqe get = wait_cqe(&ring, epfd, &sleeps);
        if (flush.user_data != 1 || flush.res != 0 || get.user_data != 2 || get.res != 8 ||
            buf[64] != round * 100 + 7) {
            fprintf(stderr, "round %" PRIu64 ": unexpected completions\n", round);
            return 1;
        }
    }
    printf("epoll_client: %" PRIu64 " rounds of 8 PUTs, FLUSH and GET; slept in epoll %" PRIu64
           " times\n",
           rounds, sleeps);
    close(epfd);
    TRY(rf_ring_destroy(&ring));
    TRY(rf_worker_destroy(w)); /* stops the core thread */
    return 0;
}

int main(int argc, char **argv)
{
    if (argc == 3 && strcmp(argv[1], "target") == 0)
        return target(atoi(argv[2]));
    uint64_t rounds = argc > 1 ? strtoull(argv[1], NULL, 10) : 1000;
    int fd;
    pid_t child = spawn_peer(argv[0], "target", &fd);
    if (child < 0)
        return 1;
    int rc = client(fd, rounds);
    close(fd); /* the target's cue to leave */
    int status = 0;
    waitpid(child, &status, 0);
    return rc != 0 || !WIFEXITED(status) || WEXITSTATUS(status) != 0;
}
