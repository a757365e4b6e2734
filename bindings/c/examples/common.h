/* What the examples and the C bench share: a check that exits on an RF_E* status,
   whole-buffer writes and reads on the socket that carries their offers, the offer
   itself (a worker address, a packed key and the window's address) both ways, and
   the second process each of them runs itself as. */
#ifndef RINGFENCE_EXAMPLES_COMMON_H
#define RINGFENCE_EXAMPLES_COMMON_H

#include <ringfence.h>

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <sys/types.h>
#include <unistd.h>

#define TRY(call)                                                                         \
    do {                                                                                  \
        int rc_ = (call);                                                                 \
        if (rc_ < 0) {                                                                    \
            fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #call, rf_strerror(rc_)); \
            exit(1);                                                                      \
        }                                                                                 \
    } while (0)

static inline void send_all(int fd, const void *p, size_t len)
{
    for (const char *b = p; len > 0;) {
        ssize_t n = write(fd, b, len);
        if (n <= 0)
            exit(1);
        b += n;
        len -= (size_t)n;
    }
}

static inline void recv_all(int fd, void *p, size_t len)
{
    for (char *b = p; len > 0;) {
        ssize_t n = read(fd, b, len);
        if (n <= 0)
            exit(1);
        b += n;
        len -= (size_t)n;
    }
}

/* Offers `window` (registered as `mem` with worker `w`) to the peer on `fd`. */
static inline void send_offer(int fd, rf_worker_t w, uint32_t mem, const void *window)
{
    uint8_t addr[512], key[512];
    size_t lens[2];
    TRY(rf_worker_address(w, addr, sizeof addr, &lens[0]));
    TRY(rf_rkey_pack(w, mem, key, sizeof key, &lens[1]));
    uint64_t base = (uint64_t)(uintptr_t)window;
    send_all(fd, lens, sizeof lens);
    send_all(fd, addr, lens[0]);
    send_all(fd, key, lens[1]);
    send_all(fd, &base, sizeof base);
}

/* Takes the peer's offer from `fd`: connects `w` to it (`*ep`), unpacks its key
   (`*rkey`) and reads its window's address (`*remote`). Exits on a malformed offer. */
static inline void take_offer(int fd, rf_worker_t w, uint32_t *ep, uint32_t *rkey,
                              uint64_t *remote)
{
    uint8_t addr[512], key[512];
    size_t lens[2];
    recv_all(fd, lens, sizeof lens);
    if (lens[0] > sizeof addr || lens[1] > sizeof key)
        exit(1);
    recv_all(fd, addr, lens[0]);
    recv_all(fd, key, lens[1]);
    recv_all(fd, remote, sizeof *remote);
    TRY(rf_ep_connect(w, addr, lens[0], ep));
    TRY(rf_rkey_unpack(w, *ep, key, lens[1], rkey));
}

/* Runs this program again in a child process as `argv0 role FD`, FD being its end of
   a socket pair; returns the child's pid, with this side's end in `*fd`, or -1. */
static inline pid_t spawn_peer(const char *argv0, const char *role, int *fd)
{
    int pair[2];
    if (socketpair(AF_UNIX, SOCK_STREAM, 0, pair) != 0)
        return -1;
    pid_t child = fork();
    if (child == 0) {
        close(pair[0]);
        char child_fd[16];
        snprintf(child_fd, sizeof child_fd, "%d", pair[1]);
        execl("/proc/self/exe", argv0, role, child_fd, (char *)NULL);
        perror("exec");
        _exit(1);
    }
    close(pair[1]);
    if (child < 0) {
        close(pair[0]);
        return -1;
    }
    *fd = pair[0];
    return child;
}

#endif
