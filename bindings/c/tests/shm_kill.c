/*
 * A target killed with SIGKILL and reaped with waitpid before the
 * initiator makes progress, from C, a hundred times: the PUTs queued
 * before the kill and the FLUSH behind them all fail with
 * RF_EPEER_UNREACHABLE, exactly once each; so do rf_ring_try_now, later
 * PUTs and FLUSHes, and the graceful close. The target is this program
 * again (exec'd with "--target"), so the child starts clean however many
 * threads the parent runs.
 */
#include "rft_link.h"

#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#define ROUNDS 100
#define QUEUED 48 /* PUTs queued before the kill (the SQ holds 64) */
#define WINDOW (64u << 10)

/* The target: offers a window, then waits to be killed. */
static int target_main(int fd)
{
    rf_worker_t w = rft_shm_worker();
    uint8_t *window = NULL;
    uint32_t mem = 0;
    MUST(rf_mem_alloc(w, WINDOW, (void **)&window, &mem));
    uint8_t addr[512], key[512];
    size_t addr_len = 0, key_len = 0;
    MUST(rf_worker_address(w, addr, sizeof addr, &addr_len));
    MUST(rf_rkey_pack(w, mem, key, sizeof key, &key_len));
    rft_send_blob(fd, addr, addr_len);
    rft_send_blob(fd, key, key_len);
    uint64_t base = (uint64_t)(uintptr_t)window;
    rft_send_all(fd, &base, sizeof base);
    uint8_t byte;
    (void)read(fd, &byte, 1); /* never answered: the parent kills us */
    return 0;
}

static rf_worker_t w;
static struct rf_ring ring;
static uint8_t *src;
static uint32_t src_mem;
static const char *self_exe;

static void prep_put(struct rf_sqe *sqe, uint32_t ep, uint32_t rkey, uint64_t base,
                     uint64_t i)
{
    rf_prep_put(sqe, ep, src + (i % 64) * 64, src_mem, base + (i % 64) * 64, rkey, 64);
    rf_sqe_set_data(sqe, i);
}

/* One round: spawn a target, connect, queue PUTs and a FLUSH, kill and
   reap it, then make progress. */
static void one_round(int round)
{
    int pair[2];
    if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, pair) != 0) {
        perror("socketpair");
        exit(1);
    }
    pid_t child = fork();
    if (child < 0) {
        perror("fork");
        exit(1);
    }
    if (child == 0) {
        /* Only exec here: the parent has threads. */
        int fd = dup(pair[1]); /* without CLOEXEC */
        char fdstr[16];
        snprintf(fdstr, sizeof fdstr, "%d", fd);
        execl(self_exe, self_exe, "--target", fdstr, (char *)NULL);
        _exit(127);
    }
    close(pair[1]);
    int fd = pair[0];
    uint8_t addr[512], key[512];
    size_t addr_len = rft_recv_blob(fd, addr, sizeof addr);
    size_t key_len = rft_recv_blob(fd, key, sizeof key);
    uint64_t base;
    rft_recv_all(fd, &base, sizeof base);
    uint32_t ep = 0, rkey = 0;
    MUST(rf_ep_connect(w, addr, addr_len, &ep));
    MUST(rf_rkey_unpack(w, ep, key, key_len, &rkey));

    for (uint64_t i = 0; i < QUEUED; i++)
        prep_put(rft_sqe(&ring), ep, rkey, base, i);
    struct rf_sqe *sqe = rft_sqe(&ring);
    rf_prep_flush(sqe, ep);
    rf_sqe_set_data(sqe, QUEUED);
    CHECK(rf_submit(&ring) == QUEUED + 1);

    kill(child, SIGKILL);
    int status = 0;
    CHECK(waitpid(child, &status, 0) == child);
    close(fd);

    int seen[QUEUED + 1] = {0};
    for (int n = 0; n < QUEUED + 1; n++) {
        struct rf_cqe c = rft_one_cqe(w, &ring);
        if (c.res != RF_EPEER_UNREACHABLE || c.user_data > QUEUED) {
            fprintf(stderr, "round %d: CQE %llu res %d after the reap\n", round,
                    (unsigned long long)c.user_data, c.res);
            CHECK(0);
            return;
        }
        seen[c.user_data]++;
    }
    for (int i = 0; i <= QUEUED; i++)
        CHECK(seen[i] == 1);

    struct rf_sqe now;
    prep_put(&now, ep, rkey, base, 500);
    int32_t res = 0;
    CHECK_RC(rf_ring_try_now(&ring, &now, &res), 1);
    CHECK_RC(res, RF_EPEER_UNREACHABLE);
    prep_put(rft_sqe(&ring), ep, rkey, base, 501);
    sqe = rft_sqe(&ring);
    rf_prep_flush(sqe, ep);
    rf_sqe_set_data(sqe, 502);
    rf_submit(&ring);
    for (int n = 0; n < 2; n++) {
        struct rf_cqe c = rft_one_cqe(w, &ring);
        CHECK(c.user_data == 501 + (uint64_t)n);
        CHECK_RC(c.res, RF_EPEER_UNREACHABLE);
    }
    CHECK_RC(rf_submit_close(&ring, ep, RF_CLOSE_GRACEFUL, 503), 0);
    struct rf_cqe c = rft_one_cqe(w, &ring);
    CHECK(c.user_data == 503);
    CHECK_RC(c.res, RF_EPEER_UNREACHABLE);
}

static void nothing_succeeds_after_the_reap(void)
{
    for (int round = 0; round < ROUNDS && !rft_case_failed; round++)
        one_round(round);
}

int main(int argc, char **argv)
{
    if (argc == 3 && strcmp(argv[1], "--target") == 0)
        return target_main(atoi(argv[2]));
    self_exe = "/proc/self/exe";
    signal(SIGPIPE, SIG_IGN);
    w = rft_shm_worker();
    MUST(rf_ring_create(w, 0, 0, &ring));
    MUST(rf_mem_alloc(w, WINDOW, (void **)&src, &src_mem));
    RFT_RUN(nothing_succeeds_after_the_reap);
    MUST(rf_ring_destroy(&ring));
    MUST(rf_worker_destroy(w));
    return rft_finish("shm_kill");
}
