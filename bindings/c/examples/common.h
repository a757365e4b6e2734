/* What the examples and the C bench share: a check that exits on an RF_E* status, and
   whole-buffer writes and reads on the socket that carries their offers. */
#ifndef RINGFENCE_EXAMPLES_COMMON_H
#define RINGFENCE_EXAMPLES_COMMON_H

#include <ringfence.h>

#include <stdio.h>
#include <stdlib.h>
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

#endif
