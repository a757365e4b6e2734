/*
 * Data correctness across two real processes over the shm driver: the
 * parent (initiator) writes into the child's (target's) memory with PUTs
 * posted through the inline helpers, reads it back with GETs, runs atomics
 * on it and sends a notification; the child checks every byte in its own
 * memory. The processes are forked before either touches the library (no
 * threads yet), and talk over a socket pair.
 */
#include "rft_link.h"

#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#define WINDOW (2u << 20)

enum { CMD_EXIT, CMD_CHECK, CMD_WORD, CMD_NOTIFY, CMD_WATCH };

static int sock = -1;

static void send_all(const void *p, size_t len) { rft_send_all(sock, p, len); }
static void recv_all(void *p, size_t len) { rft_recv_all(sock, p, len); }
static void send_u64s(const uint64_t *v, size_t n) { send_all(v, n * sizeof *v); }
static uint64_t recv_u64(void) { return rft_recv_u64(sock); }
static void send_blob(const uint8_t *b, size_t len) { rft_send_blob(sock, b, len); }
static size_t recv_blob(uint8_t *b, size_t cap) { return rft_recv_blob(sock, b, cap); }

static uint8_t pattern_byte(size_t i, uint64_t seed)
{
    return (uint8_t)(i * 31 + seed * 7 + (i >> 8));
}

static void fill(uint8_t *p, size_t len, uint64_t seed)
{
    for (size_t i = 0; i < len; i++)
        p[i] = pattern_byte(i, seed);
}

static int matches(const volatile uint8_t *p, size_t len, uint64_t seed)
{
    for (size_t i = 0; i < len; i++)
        if (p[i] != pattern_byte(i, seed))
            return 0;
    return 1;
}

/* ------------------------------------------------------------- target */

static int target_main(void)
{
    rf_worker_t w = rft_shm_worker();
    struct rf_ring ring; /* the first ring: it receives notifications */
    MUST(rf_ring_create(w, 0, 0, &ring));
    uint8_t *window = NULL;
    uint32_t mem = 0;
    MUST(rf_mem_alloc(w, WINDOW, (void **)&window, &mem));
    uint8_t addr[512], key[512];
    size_t addr_len = 0, key_len = 0;
    MUST(rf_worker_address(w, addr, sizeof addr, &addr_len));
    MUST(rf_rkey_pack(w, mem, key, sizeof key, &key_len));
    send_blob(addr, addr_len);
    send_blob(key, key_len);
    uint64_t base = (uint64_t)(uintptr_t)window;
    send_u64s(&base, 1);

    for (;;) {
        uint64_t cmd[4];
        recv_all(cmd, sizeof cmd);
        uint64_t reply = 0;
        switch (cmd[0]) {
        case CMD_EXIT:
            MUST(rf_ring_destroy(&ring));
            MUST(rf_worker_destroy(w));
            return 0;
        case CMD_CHECK: /* offset, len, seed */
            reply = matches(window + cmd[1], cmd[2], cmd[3]);
            break;
        case CMD_WORD: /* offset */
            reply = __atomic_load_n((uint64_t *)(window + cmd[1]), __ATOMIC_ACQUIRE);
            break;
        case CMD_WATCH: { /* offset, last: poll the word until it holds
                             `last`; every value seen must be whole */
            uint64_t seen = 0, torn = 0, steps = 0;
            double deadline = rft_now() + RFT_HANG_SECONDS;
            while (seen != (cmd[2] | cmd[2] << 32) && rft_now() < deadline) {
                uint64_t v = rf_load_u64(window + cmd[1]);
                if (v >> 32 != (v & 0xffffffffu) || (v & 0xffffffffu) < (seen & 0xffffffffu))
                    torn++;
                if (v != seen)
                    steps++;
                seen = v;
            }
            reply = torn == 0 && seen == (cmd[2] | cmd[2] << 32) ? steps : 0;
            break;
        }
        case CMD_NOTIFY: { /* len, seed */
            struct rf_cqe c = rft_one_cqe(w, &ring);
            uint8_t payload[256];
            size_t len = 0;
            int rc = rf_notification_read(&ring, &c, payload, sizeof payload, &len);
            reply = rc == 0 && (c.flags & RF_CQE_NOTIFICATION) && len == cmd[1] &&
                    matches(payload, len, cmd[2]);
            /* Read once: a second read is refused. */
            reply = reply && rf_notification_read(&ring, &c, payload, sizeof payload, &len) ==
                                 RF_EINVALID_ARGUMENT;
            break;
        }
        default:
            return 1;
        }
        send_u64s(&reply, 1);
    }
}

/* ---------------------------------------------------------- initiator */

static rf_worker_t w;
static struct rf_ring ring;
static uint32_t ep, rkey, src_mem, dst_mem;
static uint64_t base;
static uint8_t *src, *dst;

static uint64_t ask(uint64_t op, uint64_t a, uint64_t b, uint64_t c)
{
    uint64_t cmd[4] = {op, a, b, c};
    send_u64s(cmd, 4);
    return recv_u64();
}

static void connect_to_target(void)
{
    uint8_t addr[512], key[512];
    size_t addr_len = recv_blob(addr, sizeof addr);
    size_t key_len = recv_blob(key, sizeof key);
    base = recv_u64();
    w = rft_shm_worker();
    MUST(rf_ep_connect(w, addr, addr_len, &ep));
    MUST(rf_rkey_unpack(w, ep, key, key_len, &rkey));
    MUST(rf_mem_alloc(w, WINDOW, (void **)&src, &src_mem));
    MUST(rf_mem_alloc(w, WINDOW, (void **)&dst, &dst_mem));
    MUST(rf_ring_create(w, 0, 0, &ring));
}

static void put_fence_get_every_size(void)
{
    static const size_t sizes[] = {1, 7, 8, 63, 64, 100, 4093, 4096, 65537, WINDOW / 2};
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
        size_t len = sizes[i], offset = (i * 7919) % 4096;
        uint64_t seed = i + 1;
        fill(src, len, seed);
        memset(dst, 0, len);
        struct rf_sqe *sqe = rft_sqe(&ring);
        rf_prep_put(sqe, ep, src, src_mem, base + offset, rkey, (uint32_t)len);
        rf_sqe_set_data(sqe, 1);
        sqe = rft_sqe(&ring);
        rf_prep_fence(sqe, ep, RF_FENCE_COMPLETE);
        rf_sqe_set_data(sqe, 2);
        sqe = rft_sqe(&ring);
        rf_prep_get(sqe, ep, dst, dst_mem, base + offset, rkey, (uint32_t)len);
        rf_sqe_set_data(sqe, 3);
        CHECK(rf_submit(&ring) == 3);
        for (uint64_t want = 1; want <= 3; want++) {
            struct rf_cqe c = rft_one_cqe(w, &ring);
            CHECK(c.user_data == want);
            CHECK(c.res == (want == 2 ? 0 : (int)len));
        }
        CHECK(matches(dst, len, seed));
        CHECK(ask(CMD_CHECK, offset, len, seed) == 1);
    }
}

/* The benchmark's shape: batches of 32 PUTs with SKIP_SUCCESS, progress
   after each submit, one FLUSH whose CQE is the only one. */
static void skip_success_batches_then_one_flush(void)
{
    const uint64_t count = 100000;
    uint64_t posted = 0;
    double deadline = rft_now() + RFT_HANG_SECONDS;
    while (posted < count) {
        unsigned batch = 0;
        struct rf_sqe *sqe;
        while (batch < 32 && posted + batch < count && (sqe = rf_get_sqe(&ring)) != NULL) {
            uint64_t k = posted + batch;
            src[k % 512 * 8] = (uint8_t)k;
            rf_prep_put(sqe, ep, src + k % 512 * 8, src_mem, base + k % 512 * 8, rkey, 8);
            rf_sqe_set_flags(sqe, RF_SQE_SKIP_SUCCESS);
            batch++;
        }
        rf_submit(&ring);
        rf_progress(w);
        posted += batch;
        CHECK(rft_now() < deadline);
        if (rft_now() > deadline)
            return;
    }
    struct rf_sqe *sqe = rft_sqe(&ring);
    rf_prep_flush(sqe, ep);
    rf_sqe_set_data(sqe, UINT64_MAX);
    rf_submit(&ring);
    struct rf_cqe c = rft_one_cqe(w, &ring);
    CHECK(c.user_data == UINT64_MAX && c.res == 0);
    struct rf_cqe *none;
    rf_progress(w);
    CHECK_RC(rf_peek_cqe(&ring, &none), RF_EAGAIN);
    /* The last 512 PUTs are what the window holds. */
    for (uint64_t k = count - 512; k < count; k++)
        CHECK(src[k % 512 * 8] == (uint8_t)k);
    int same = 1;
    for (int slot = 0; slot < 512 && same; slot++) {
        uint8_t want = src[slot * 8];
        uint64_t word = ask(CMD_WORD, (uint64_t)slot * 8, 0, 0);
        same = (uint8_t)word == want;
    }
    CHECK(same);
}

static void atomics_on_the_targets_word(void)
{
    const uint64_t offset = WINDOW - 64;
    uint64_t *result = (uint64_t *)(void *)dst;
    for (uint64_t i = 0; i < 1000; i++) {
        struct rf_sqe *sqe = rft_sqe(&ring);
        rf_prep_atomic(sqe, ep, RF_ATOMIC_FADD, result, dst_mem, base + offset, rkey, 3, 0);
        rf_sqe_set_data(sqe, i);
        rf_submit(&ring);
        struct rf_cqe c = rft_one_cqe(w, &ring);
        CHECK(c.res >= 0 && c.user_data == i);
        CHECK(*result == 3 * i);
    }
    struct rf_sqe *sqe = rft_sqe(&ring);
    rf_prep_atomic(sqe, ep, RF_ATOMIC_CSWAP, result, dst_mem, base + offset, rkey, 3000, 42);
    rf_submit(&ring);
    struct rf_cqe c = rft_one_cqe(w, &ring);
    CHECK(c.res >= 0 && *result == 3000);
    sqe = rft_sqe(&ring);
    rf_prep_atomic(sqe, ep, RF_ATOMIC_ADD, NULL, 0, base + offset, rkey, 8, 0);
    rf_submit(&ring);
    c = rft_one_cqe(w, &ring);
    CHECK(c.res >= 0);
    CHECK(ask(CMD_WORD, offset, 0, 0) == 50);
}

/* An aligned 8-byte PUT lands as one store: the target polls the word
   with rf_load_u64 while 20,000 PUTs of values whose two halves are equal
   land on it, and never sees a mix of two values or an older one. */
static void an_aligned_8_byte_put_lands_whole(void)
{
    const uint64_t offset = WINDOW - 128, last = 20000;
    uint64_t cmd[4] = {CMD_WATCH, offset, last, 0};
    send_u64s(cmd, 4);
    uint64_t *word = (uint64_t *)(void *)(src + 64);
    for (uint64_t k = 1; k <= last; k++) {
        rf_store_u64(word, k | k << 32);
        struct rf_sqe *sqe = rft_sqe(&ring);
        rf_prep_put(sqe, ep, word, src_mem, base + offset, rkey, 8);
        rf_sqe_set_data(sqe, k);
        rf_submit(&ring);
        struct rf_cqe c = rft_one_cqe(w, &ring);
        CHECK(c.res == 8 && c.user_data == k);
    }
    CHECK(recv_u64() > 0); /* the number of values the target saw, all whole */
    CHECK(rf_load_u64(word) == (last | last << 32));
}

static void notification_after_the_puts(void)
{
    fill(src, 4096, 77);
    struct rf_sqe *sqe = rft_sqe(&ring);
    rf_prep_put(sqe, ep, src, src_mem, base, rkey, 4096);
    rf_sqe_set_flags(sqe, RF_SQE_SKIP_SUCCESS);
    uint8_t *payload = src + 8192;
    fill(payload, 200, 5);
    sqe = rft_sqe(&ring);
    rf_prep_notify(sqe, ep, payload, src_mem, 200);
    rf_sqe_set_data(sqe, 9);
    rf_submit(&ring);
    struct rf_cqe c = rft_one_cqe(w, &ring);
    CHECK(c.user_data == 9 && c.res >= 0);
    CHECK(ask(CMD_NOTIFY, 200, 5, 0) == 1);
    CHECK(ask(CMD_CHECK, 0, 4096, 77) == 1);
}

static void close_then_operations_fail(void)
{
    CHECK_RC(rf_submit_close(&ring, ep, RF_CLOSE_GRACEFUL, 5), 0);
    struct rf_cqe c = rft_one_cqe(w, &ring);
    CHECK(c.user_data == 5 && c.res == 0);
    struct rf_sqe *sqe = rft_sqe(&ring);
    rf_prep_put(sqe, ep, src, src_mem, base, rkey, 8);
    rf_sqe_set_data(sqe, 6);
    rf_submit(&ring);
    c = rft_one_cqe(w, &ring);
    CHECK(c.user_data == 6 && c.res == RF_EENDPOINT_CLOSED);
}

int main(void)
{
    int pair[2];
    if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, pair) != 0) {
        perror("socketpair");
        return 1;
    }
    fflush(stdout);
    pid_t child = fork();
    if (child < 0) {
        perror("fork");
        return 1;
    }
    if (child == 0) {
        close(pair[0]);
        sock = pair[1];
        exit(target_main());
    }
    close(pair[1]);
    sock = pair[0];
    connect_to_target();
    RFT_RUN(put_fence_get_every_size);
    RFT_RUN(skip_success_batches_then_one_flush);
    RFT_RUN(atomics_on_the_targets_word);
    RFT_RUN(an_aligned_8_byte_put_lands_whole);
    RFT_RUN(notification_after_the_puts);
    RFT_RUN(close_then_operations_fail);
    uint64_t cmd[4] = {CMD_EXIT, 0, 0, 0};
    send_u64s(cmd, 4);
    int status = 0;
    waitpid(child, &status, 0);
    MUST(rf_ring_destroy(&ring));
    MUST(rf_worker_destroy(w));
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
        fprintf(stderr, "target process failed (status %d)\n", status);
        rft_failed++;
    }
    return rft_finish("shm_two_process");
}
