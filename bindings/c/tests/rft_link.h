/*
 * What the two-process C tests share: a byte stream to the other process
 * (a socket pair), blobs with a length in front, and the shm worker both
 * sides build.
 */
#ifndef RFT_LINK_H
#define RFT_LINK_H

#include "rftest.h"

#include <unistd.h>

static void rft_send_all(int fd, const void *p, size_t len)
{
    const uint8_t *b = (const uint8_t *)p;
    while (len > 0) {
        ssize_t n = write(fd, b, len);
        if (n <= 0) {
            perror("write");
            exit(1);
        }
        b += n;
        len -= (size_t)n;
    }
}

static void rft_recv_all(int fd, void *p, size_t len)
{
    uint8_t *b = (uint8_t *)p;
    while (len > 0) {
        ssize_t n = read(fd, b, len);
        if (n <= 0) {
            fprintf(stderr, "peer hung up\n");
            exit(1);
        }
        b += n;
        len -= (size_t)n;
    }
}

static uint64_t rft_recv_u64(int fd)
{
    uint64_t v;
    rft_recv_all(fd, &v, sizeof v);
    return v;
}

static void rft_send_blob(int fd, const void *b, size_t len)
{
    uint64_t l = len;
    rft_send_all(fd, &l, sizeof l);
    rft_send_all(fd, b, len);
}

/* A blob of at most `cap` bytes into `b`; its length. */
static size_t rft_recv_blob(int fd, uint8_t *b, size_t cap)
{
    uint64_t len = rft_recv_u64(fd);
    if (len > cap)
        exit(1);
    rft_recv_all(fd, b, len);
    return (size_t)len;
}

/* A worker with the shm driver and a 64-entry SQ. */
static rf_worker_t rft_shm_worker(void)
{
    struct rf_worker_config config;
    MUST(rf_worker_config_init(&config));
    config.drivers = "shm";
    config.ignore_env = 1;
    config.sq_entries = 64;
    config.cq_entries = 128;
    rf_worker_t w = 0;
    MUST(rf_worker_create(&config, &w));
    return w;
}

#endif
