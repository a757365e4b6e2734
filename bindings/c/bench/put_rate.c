/*
 * The 8-byte PUT message rate over the shared-memory driver, posted from C
 * through the inline helpers: the C twin of the Rust bench
 * `cargo bench -p ringfence-benches --bench shm -- put_rate_8B/ringfence_shm`
 * (benches/benches/shm.rs, Link::puts), with the same shape:
 *
 * - a peer process (this program, re-executed) allocates a 2 MiB window (a
 *   sealed memfd), sends its address, key and window address, and sleeps:
 *   one-sided PUTs need nothing from it;
 * - this process connects (worker with 256 SQ / 512 CQ entries), and pushes
 *   8-byte PUTs from a registered source to offset 0 of the window, every
 *   one with SKIP_SUCCESS, in batches of 32 (rf_get_sqe + rf_prep_put),
 *   each batch published with rf_submit and followed by rf_progress on this
 *   thread; one FLUSH at the end of each sample must come back as the only
 *   CQE;
 * - before timing, 1,000 PUTs of a pattern are read back with GET and
 *   checked.
 *
 * It prints the rate of each sample and their median.
 *
 *   cargo build --release -p ringfence-c
 *   cc -O2 bindings/c/bench/put_rate.c $(pkg-config --cflags --libs ringfence) -o put_rate
 *   ./put_rate [samples] [puts per sample]
 */
#define _GNU_SOURCE
#include "../examples/common.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define BATCH 32
#define WINDOW (2u << 20)

static rf_worker_t shm_worker(void)
{
    struct rf_worker_config config;
    TRY(rf_worker_config_init(&config));
    config.drivers = "shm";
    config.sq_entries = 256;
    config.cq_entries = 512;
    config.ignore_env = 1;
    rf_worker_t w;
    TRY(rf_worker_create(&config, &w));
    return w;
}

static int peer(int fd)
{
    rf_worker_t w = shm_worker();
    void *window;
    uint32_t mem;
    TRY(rf_mem_alloc(w, WINDOW, &window, &mem));
    send_offer(fd, w, mem, window);
    char byte;
    while (read(fd, &byte, 1) > 0) {
    }
    TRY(rf_worker_destroy(w));
    return 0;
}

struct link {
    rf_worker_t worker;
    struct rf_ring ring;
    uint8_t *src;
    uint32_t src_mem, ep, rkey;
    uint64_t remote;
};

static struct rf_cqe one_cqe(struct link *l)
{
    struct rf_cqe *cqe;
    for (;;) {
        rf_progress(l->worker);
        if (rf_peek_cqe(&l->ring, &cqe) == 0)
            break;
    }
    struct rf_cqe copy = *cqe;
    rf_cqe_seen(&l->ring, cqe);
    return copy;
}

/* `count` PUTs of 8 bytes, all SKIP_SUCCESS, then a FLUSH that must be the
   only CQE (Link::puts). */
static void put_burst(struct link *l, uint64_t count)
{
    uint64_t left = count;
    while (left > 0) {
        unsigned want = left < BATCH ? (unsigned)left : BATCH, n = 0;
        for (; n < want; n++) {
            struct rf_sqe *sqe = rf_get_sqe(&l->ring);
            if (sqe == NULL)
                break;
            rf_prep_put(sqe, l->ep, l->src, l->src_mem, l->remote, l->rkey, 8);
            rf_sqe_set_flags(sqe, RF_SQE_SKIP_SUCCESS);
        }
        rf_submit(&l->ring);
        rf_progress(l->worker);
        left -= n;
    }
    struct rf_sqe *sqe;
    while ((sqe = rf_get_sqe(&l->ring)) == NULL)
        rf_progress(l->worker);
    rf_prep_flush(sqe, l->ep);
    rf_sqe_set_data(sqe, UINT64_MAX);
    rf_submit(&l->ring);
    struct rf_cqe c = one_cqe(l);
    if (c.user_data != UINT64_MAX || c.res != 0) {
        fprintf(stderr, "a PUT failed: user_data %llu, res %d (%s)\n",
                (unsigned long long)c.user_data, c.res, rf_strerror(c.res));
        exit(1);
    }
}

/* 1,000 PUTs of a pattern, each read back with GET and compared. */
static void check(struct link *l)
{
    for (uint64_t i = 0; i < 1000; i++) {
        uint64_t value = i * 0x9e3779b97f4a7c15ull;
        memcpy(l->src, &value, 8);
        memset(l->src + 8, 0, 8);
        struct rf_sqe *sqe = rf_get_sqe(&l->ring);
        rf_prep_put(sqe, l->ep, l->src, l->src_mem, l->remote, l->rkey, 8);
        rf_sqe_set_data(sqe, 1);
        sqe = rf_get_sqe(&l->ring);
        rf_prep_get(sqe, l->ep, l->src + 8, l->src_mem, l->remote, l->rkey, 8);
        rf_sqe_set_data(sqe, 2);
        rf_submit(&l->ring);
        for (int k = 0; k < 2; k++)
            if (one_cqe(l).res != 8)
                exit(1);
        if (memcmp(l->src, l->src + 8, 8) != 0) {
            fprintf(stderr, "GET read other bytes than the PUT wrote\n");
            exit(1);
        }
    }
}

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static int by_value(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

int main(int argc, char **argv)
{
    if (argc == 3 && strcmp(argv[1], "peer") == 0)
        return peer(atoi(argv[2]));
    int samples = argc > 1 ? atoi(argv[1]) : 20;
    uint64_t per_sample = argc > 2 ? strtoull(argv[2], NULL, 10) : 2000000;
    if (samples < 1 || samples > 1000 || per_sample == 0)
        return 2;
    int fd;
    pid_t child = spawn_peer(argv[0], "peer", &fd);
    if (child < 0)
        return 1;

    struct link l;
    l.worker = shm_worker();
    take_offer(fd, l.worker, &l.ep, &l.rkey, &l.remote);
    TRY(rf_mem_alloc(l.worker, WINDOW, (void **)&l.src, &l.src_mem));
    TRY(rf_ring_create(l.worker, 0, 0, &l.ring));
    memset(l.src, 7, 64);

    check(&l);
    put_burst(&l, per_sample); /* warm-up */
    double rates[1000];
    for (int s = 0; s < samples; s++) {
        double t0 = now();
        put_burst(&l, per_sample);
        double dt = now() - t0;
        rates[s] = (double)per_sample / dt;
        printf("sample %d: %.2f M msg/s (%.2f ns per PUT)\n", s, rates[s] / 1e6,
               dt * 1e9 / (double)per_sample);
    }
    qsort(rates, (size_t)samples, sizeof rates[0], by_value);
    double median = samples % 2 ? rates[samples / 2]
                                : (rates[samples / 2 - 1] + rates[samples / 2]) / 2;
    printf("put_rate_8B/c_inline: median %.3f M msg/s over %d samples of %llu PUTs\n",
           median / 1e6, samples, (unsigned long long)per_sample);
    printf("msgs_per_sec=%.0f\n", median);

    TRY(rf_ring_destroy(&l.ring));
    TRY(rf_worker_destroy(l.worker));
    close(fd);
    int status = 0;
    waitpid(child, &status, 0);
    return 0;
}
