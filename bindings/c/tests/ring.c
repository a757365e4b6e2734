/*
 * The inline ring helpers in one process (loopback driver): batches and
 * wrap-around, a full CQ (overflow: nothing dropped, order kept), the core
 * thread's NEED_WAKEUP sleep and rf_submit's wake-up, waiting for CQEs in
 * epoll on the CQ's eventfd, and a ring failed by a corrupt SQ tail.
 */
#include "rftest.h"

#include <sys/epoll.h>
#include <unistd.h>

static rf_worker_t worker(int core_thread)
{
    struct rf_worker_config config;
    MUST(rf_worker_config_init(&config));
    config.drivers = "loopback";
    config.ignore_env = 1;
    config.core_thread = (uint32_t)core_thread;
    rf_worker_t w = 0;
    MUST(rf_worker_create(&config, &w));
    return w;
}

static void nops_in_batches_wrap_in_order(void)
{
    rf_worker_t w = worker(0);
    struct rf_ring ring;
    MUST(rf_ring_create(w, 8, 8, &ring));
    uint64_t next_in = 0, next_out = 0;
    struct rf_cqe *cqes[5];
    for (unsigned round = 0; round < 2000; round++) {
        unsigned want = 1 + round % 7;
        for (unsigned i = 0; i < want; i++) {
            struct rf_sqe *sqe = rf_get_sqe(&ring);
            if (sqe == NULL)
                break;
            rf_prep_nop(sqe);
            rf_sqe_set_data(sqe, next_in++);
        }
        CHECK(rf_sq_pending(&ring) <= 8);
        rf_submit(&ring);
        CHECK(rf_sq_pending(&ring) == 0);
        rf_progress(w);
        int n = rf_peek_batch_cqe(&ring, cqes, round % 5 + 1);
        CHECK(n >= 0);
        for (int i = 0; i < n; i++) {
            CHECK(cqes[i]->user_data == next_out && cqes[i]->res == 0);
            next_out++;
        }
        rf_cq_advance(&ring, (unsigned)(n > 0 ? n : 0));
    }
    while (next_out < next_in) {
        struct rf_cqe c = rft_one_cqe(w, &ring);
        CHECK(c.user_data == next_out);
        next_out++;
    }
    CHECK(next_in > 4000);
    MUST(rf_ring_destroy(&ring));
    MUST(rf_worker_destroy(w));
}

static void a_full_cq_drops_nothing(void)
{
    rf_worker_t w = worker(0);
    struct rf_ring ring;
    MUST(rf_ring_create(w, 64, 4, &ring));
    for (uint64_t i = 0; i < 64; i++) {
        struct rf_sqe *sqe = rft_sqe(&ring);
        rf_prep_nop(sqe);
        rf_sqe_set_data(sqe, i);
    }
    CHECK(rf_get_sqe(&ring) == NULL); /* SQ full */
    CHECK(rf_submit(&ring) == 64);
    rf_progress(w);
    rf_progress(w);
    CHECK(rf_cq_overflowed(&ring));
    for (uint64_t i = 0; i < 64; i++) {
        struct rf_cqe c = rft_one_cqe(w, &ring);
        CHECK(c.user_data == i && c.res == 0);
    }
    rf_progress(w);
    CHECK(!rf_cq_overflowed(&ring));
    MUST(rf_ring_destroy(&ring));
    MUST(rf_worker_destroy(w));
}

/* A loopback initiator `w` connected (endpoint `ep`) to `target`, whose
   window of `window_len` bytes it reaches through `rkey`, and `local`
   registered on `w` as `mem`. */
struct link {
    rf_worker_t target, w;
    uint32_t ep, mem, rkey;
    uint8_t *window;
};

static struct link connect_window(size_t window_len, void *local, size_t local_len)
{
    struct link l = {.target = worker(0), .w = worker(0)};
    uint8_t addr[512], key[512];
    size_t addr_len = 0, key_len = 0;
    uint32_t window_mem = 0;
    MUST(rf_worker_address(l.target, addr, sizeof addr, &addr_len));
    MUST(rf_mem_alloc(l.target, window_len, (void **)&l.window, &window_mem));
    MUST(rf_rkey_pack(l.target, window_mem, key, sizeof key, &key_len));
    MUST(rf_ep_connect(l.w, addr, addr_len, &l.ep));
    MUST(rf_rkey_unpack(l.w, l.ep, key, key_len, &l.rkey));
    MUST(rf_mem_register(l.w, local, local_len, &l.mem));
    return l;
}

static void put_and_get_through_loopback(void)
{
    static uint8_t local[8192];
    struct link l = connect_window(4096, local, sizeof local);
    rf_worker_t target = l.target, w = l.w;
    uint32_t ep = l.ep, mem = l.mem, rkey = l.rkey;
    uint8_t *window = l.window;
    /* The key tells the address PUTs name (the target's own address of
       its window) and the window's length. */
    uint64_t base = 0, len = 0;
    MUST(rf_rkey_bounds(w, ep, rkey, &base, &len));
    CHECK(base == (uint64_t)(uintptr_t)window && len == 4096);
    CHECK_RC(rf_rkey_bounds(w, ep, rkey + 1000, &base, &len), RF_EINVALID_RKEY);
    CHECK_RC(rf_rkey_bounds(w, 999, rkey, &base, &len), RF_EINVALID_ENDPOINT);
    CHECK_RC(rf_rkey_bounds(w, ep, rkey, NULL, &len), RF_EINVALID_ARGUMENT);
    struct rf_ring ring;
    MUST(rf_ring_create(w, 0, 0, &ring));
    for (int i = 0; i < 4096; i++)
        local[i] = (uint8_t)(i * 13);
    struct rf_sqe *sqe = rft_sqe(&ring);
    rf_prep_put(sqe, ep, local, mem, (uint64_t)(uintptr_t)window, rkey, 4096);
    sqe = rft_sqe(&ring);
    rf_prep_fence(sqe, ep, RF_FENCE_ORDER);
    sqe = rft_sqe(&ring);
    rf_prep_get(sqe, ep, local + 4096, mem, (uint64_t)(uintptr_t)window, rkey, 4096);
    rf_sqe_set_data(sqe, 3);
    rf_submit(&ring);
    for (int i = 0; i < 3; i++)
        CHECK(rft_one_cqe(w, &ring).res >= 0);
    CHECK(memcmp(window, local, 4096) == 0);
    CHECK(memcmp(local + 4096, local, 4096) == 0);
    MUST(rf_ring_destroy(&ring));
    MUST(rf_worker_destroy(w));
    MUST(rf_worker_destroy(target));
}

/* rf_wait_cqes: without a core thread it progresses inline, with one it
   sleeps; a wait with nothing coming returns RF_ETIMEOUT no earlier than
   its deadline; more than the CQ holds is refused. */
static void bounded_waits_with_and_without_a_core_thread(void)
{
    for (int core = 0; core < 2; core++) {
        rf_worker_t w = worker(core);
        struct rf_ring ring;
        MUST(rf_ring_create(w, 64, 64, &ring));
        CHECK_RC(rf_wait_cqes(&ring, 0, 0), 0);
        double start = rft_now();
        CHECK_RC(rf_wait_cqes(&ring, 1, 20 * 1000 * 1000), RF_ETIMEOUT);
        CHECK(rft_now() - start >= 0.020);
        for (int round = 0; round < 200; round++) {
            unsigned n = 1 + (unsigned)round % 7;
            for (unsigned i = 0; i < n; i++) {
                struct rf_sqe *sqe = rft_sqe(&ring);
                rf_prep_nop(sqe);
                rf_sqe_set_data(sqe, i);
            }
            rf_submit(&ring);
            int ready = rf_wait_cqes(&ring, n, (int64_t)RFT_HANG_SECONDS * 1000000000);
            CHECK(ready >= (int)n);
            struct rf_cqe *cqes[8];
            int got = rf_peek_batch_cqe(&ring, cqes, n);
            CHECK(got == (int)n);
            for (int i = 0; i < got; i++)
                CHECK(cqes[i]->user_data == (uint64_t)i && cqes[i]->res == 0);
            rf_cq_advance(&ring, (unsigned)got);
        }
        CHECK_RC(rf_wait_cqes(&ring, 65, -1), RF_EINVALID_ARGUMENT);
        CHECK_RC(rf_wait_cqes(NULL, 1, -1), RF_EINVALID_ARGUMENT);
        MUST(rf_ring_destroy(&ring));
        MUST(rf_worker_destroy(w));
    }
}

/* A worker flush (quiet) after PUTs on two endpoints completes with 0,
   and the fence state shows it flushed each endpoint once and left
   nothing outstanding: W = C, no dirty lanes, nothing deferred. */
static void a_worker_flush_covers_every_endpoint(void)
{
    static uint8_t local[64];
    struct link a = connect_window(64, local, sizeof local);
    /* A second endpoint of the same initiator, to a second target. */
    rf_worker_t target2 = worker(0);
    uint8_t addr[512], key[512];
    size_t addr_len = 0, key_len = 0;
    uint32_t window_mem = 0, ep2 = 0, rkey2 = 0;
    uint8_t *window2 = NULL;
    MUST(rf_worker_address(target2, addr, sizeof addr, &addr_len));
    MUST(rf_mem_alloc(target2, 64, (void **)&window2, &window_mem));
    MUST(rf_rkey_pack(target2, window_mem, key, sizeof key, &key_len));
    MUST(rf_ep_connect(a.w, addr, addr_len, &ep2));
    MUST(rf_rkey_unpack(a.w, ep2, key, key_len, &rkey2));
    struct rf_ring ring;
    MUST(rf_ring_create(a.w, 0, 0, &ring));
    memset(local, 0x33, sizeof local);
    rf_prep_put(rft_sqe(&ring), a.ep, local, a.mem, (uint64_t)(uintptr_t)a.window, a.rkey, 8);
    rf_prep_put(rft_sqe(&ring), ep2, local, a.mem, (uint64_t)(uintptr_t)window2, rkey2, 8);
    struct rf_sqe *quiet = rft_sqe(&ring);
    rf_prep_flush_worker(quiet);
    rf_sqe_set_data(quiet, 77);
    rf_submit(&ring);
    for (int i = 0; i < 3; i++) {
        struct rf_cqe c = rft_one_cqe(a.w, &ring);
        CHECK(c.res >= 0);
    }
    CHECK(a.window[0] == 0x33 && window2[7] == 0x33);
    uint32_t eps[2] = {a.ep, ep2};
    for (int i = 0; i < 2; i++) {
        struct rf_fence_state st;
        MUST(rf_ep_fence_state(a.w, eps[i], &st));
        CHECK(st.worker_flushes == 1 && st.user_flushes == 0 && st.fence_flushes == 0);
        CHECK(st.submit_epoch == st.admitted_epoch && st.dirty_lanes == 0);
        CHECK(st.deferred == 0 && st.in_flight == 0 && st.weak_lane == 255);
    }
    struct rf_fence_state st;
    CHECK_RC(rf_ep_fence_state(a.w, 999, &st), RF_EINVALID_ENDPOINT);
    CHECK_RC(rf_ep_fence_state(a.w, a.ep, NULL), RF_EINVALID_ARGUMENT);
    MUST(rf_ring_destroy(&ring));
    MUST(rf_worker_destroy(a.w));
    MUST(rf_worker_destroy(a.target));
    MUST(rf_worker_destroy(target2));
}

/* Preparing never submits: a CLOSE prepared with rf_prep_close stays in
   the ring (pending, no CQE, the endpoint still up) until rf_submit;
   rf_submit_close is the one helper that submits, and says so. */
static void preparing_a_close_does_not_submit(void)
{
    static uint8_t local[64];
    struct link l = connect_window(64, local, sizeof local);
    struct rf_ring ring;
    MUST(rf_ring_create(l.w, 0, 0, &ring));
    struct rf_sqe *sqe = rft_sqe(&ring);
    rf_prep_close(sqe, l.ep, RF_CLOSE_GRACEFUL);
    rf_sqe_set_data(sqe, 5);
    CHECK(rf_sq_pending(&ring) == 1);
    for (int i = 0; i < 10; i++)
        MUST(rf_progress(l.w));
    struct rf_cqe *none = NULL;
    CHECK(rf_peek_cqe(&ring, &none) == RF_EAGAIN);
    CHECK_RC(rf_ep_state(l.w, l.ep, NULL), RF_EP_CONNECTED);
    rf_submit(&ring);
    struct rf_cqe c = rft_one_cqe(l.w, &ring);
    CHECK(c.user_data == 5 && c.res == 0);
    CHECK_RC(rf_ep_state(l.w, l.ep, NULL), RF_EP_CLOSED);
    MUST(rf_ring_destroy(&ring));
    MUST(rf_worker_destroy(l.w));
    MUST(rf_worker_destroy(l.target));
}

/* rf_ring_try_now runs a PUT at once (its result is its completion, no
   CQE follows) and declines while the ring holds an SQE not yet taken. */
static void try_now_runs_or_declines(void)
{
    static uint8_t local[64];
    struct link l = connect_window(64, local, sizeof local);
    rf_worker_t target = l.target, w = l.w;
    uint32_t ep = l.ep, mem = l.mem, rkey = l.rkey;
    uint8_t *window = l.window;
    struct rf_ring ring;
    MUST(rf_ring_create(w, 0, 0, &ring));
    memset(local, 0x5a, sizeof local);
    struct rf_sqe put;
    memset(&put, 0, sizeof put);
    rf_prep_put(&put, ep, local, mem, (uint64_t)(uintptr_t)window, rkey, 16);
    int32_t res = 0;
    CHECK_RC(rf_ring_try_now(&ring, &put, &res), 1);
    CHECK(res == 16);
    CHECK(window[0] == 0x5a && window[15] == 0x5a && window[16] == 0);
    /* Out of bounds: declined; bad arguments: an error. */
    struct rf_sqe oob = put;
    oob.len = 65;
    CHECK_RC(rf_ring_try_now(&ring, &oob, &res), 0);
    CHECK_RC(rf_ring_try_now(&ring, NULL, &res), RF_EINVALID_ARGUMENT);
    CHECK_RC(rf_ring_try_now(&ring, &put, NULL), RF_EINVALID_ARGUMENT);
    CHECK_RC(rf_ring_try_now(NULL, &put, &res), RF_EINVALID_ARGUMENT);
    /* A NOP taken but not submitted goes first: declined. */
    struct rf_sqe *nop = rft_sqe(&ring);
    rf_prep_nop(nop);
    rf_sqe_set_data(nop, 9);
    CHECK_RC(rf_ring_try_now(&ring, &put, &res), 0);
    rf_submit(&ring);
    struct rf_cqe cqe = rft_one_cqe(w, &ring);
    CHECK(cqe.user_data == 9 && cqe.res == 0);
    CHECK_RC(rf_ring_try_now(&ring, &put, &res), 1);
    /* Nothing else comes: the PUTs that ran now have no CQE. */
    for (int i = 0; i < 10; i++)
        MUST(rf_progress(w));
    struct rf_cqe *none = NULL;
    CHECK(rf_peek_cqe(&ring, &none) == RF_EAGAIN && none == NULL);
    MUST(rf_ring_destroy(&ring));
    CHECK_RC(rf_ring_try_now(&ring, &put, &res), RF_ESTALE_HANDLE);
    MUST(rf_worker_destroy(w));
    MUST(rf_worker_destroy(target));
}

/* The core thread sleeps when idle, announcing it with NEED_WAKEUP; the
   next rf_submit must see the flag and wake it. */
static void submit_wakes_a_sleeping_core_thread(void)
{
    rf_worker_t w = worker(1);
    struct rf_ring ring;
    MUST(rf_ring_create(w, 0, 0, &ring));
    for (uint64_t i = 0; i < 5; i++) {
        double deadline = rft_now() + RFT_HANG_SECONDS;
        while (!(__atomic_load_n(ring.sq_shared_flags, __ATOMIC_ACQUIRE) & RF_SQ_NEED_WAKEUP)) {
            CHECK(rft_now() < deadline);
            if (rft_now() > deadline)
                break;
            sched_yield();
        }
        struct rf_sqe *sqe = rft_sqe(&ring);
        rf_prep_nop(sqe);
        rf_sqe_set_data(sqe, i);
        CHECK(rf_submit(&ring) == 1);
        struct rf_cqe c = rft_one_cqe(0, &ring); /* no rf_progress: the core thread */
        CHECK(c.user_data == i);
    }
    MUST(rf_ring_destroy(&ring));
    MUST(rf_worker_destroy(w)); /* stops the core thread */
}

/* An epoll loop: submit, arm the CQ eventfd, sleep in epoll_wait until the
   core thread posts, disarm, reap. */
static void epoll_on_the_cq_eventfd(void)
{
    rf_worker_t w = worker(1);
    struct rf_ring ring;
    MUST(rf_ring_create(w, 0, 0, &ring));
    int fd = rf_ring_cq_fd(&ring);
    CHECK(fd >= 0);
    int ep = epoll_create1(EPOLL_CLOEXEC);
    struct epoll_event ev = {.events = EPOLLIN, .data = {.u64 = 1}};
    CHECK(epoll_ctl(ep, EPOLL_CTL_ADD, fd, &ev) == 0);
    int slept = 0;
    for (uint64_t i = 0; i < 200; i++) {
        struct rf_sqe *sqe = rft_sqe(&ring);
        rf_prep_nop(sqe);
        rf_sqe_set_data(sqe, i);
        rf_submit(&ring);
        double deadline = rft_now() + RFT_HANG_SECONDS;
        struct rf_cqe *cqe = NULL;
        while (rf_peek_cqe(&ring, &cqe) != 0) {
            int armed = rf_ring_cq_arm(&ring);
            CHECK(armed == 0 || armed == 1);
            if (armed == 1) {
                struct epoll_event got;
                int n = epoll_wait(ep, &got, 1, 1000);
                CHECK(n >= 0);
                slept += n;
            }
            CHECK(rf_ring_cq_disarm(&ring) >= 0);
            if (rft_now() > deadline) {
                CHECK(!"no completion");
                break;
            }
        }
        if (cqe == NULL)
            break;
        CHECK(cqe->user_data == i);
        rf_cqe_seen(&ring, cqe);
    }
    CHECK(slept > 0); /* at least once the eventfd did wake us */
    close(ep);
    MUST(rf_ring_destroy(&ring));
    MUST(rf_worker_destroy(w));
}

/* A ring whose SQ tail is corrupted fails, loudly and alone: the FAILED
   flags, RF_ERING_CORRUPT from rf_progress (until it is destroyed),
   rf_ring_check, rf_wait_cqes, rf_submit, rf_ring_cq_arm, rf_ring_try_now
   and, once the CQEs published before are read, rf_peek_cqe; restoring the
   tail does not revive it; rf_ring_destroy tears it down; a second ring of
   the same worker keeps working throughout. */
static void a_corrupt_sq_tail_fails_the_ring(void)
{
    static uint8_t local[64];
    struct link l = connect_window(64, local, sizeof local);
    rf_worker_t target = l.target, w = l.w;
    struct rf_ring bad, good;
    MUST(rf_ring_create(w, 8, 8, &bad));
    MUST(rf_ring_create(w, 0, 0, &good));
    memset(local, 0x5a, sizeof local);
    for (uint64_t i = 1; i <= 2; i++) {
        struct rf_sqe *sqe = rft_sqe(&bad);
        rf_prep_nop(sqe);
        rf_sqe_set_data(sqe, i);
    }
    CHECK(rf_submit(&bad) == 2);
    CHECK(rf_progress(w) > 0); /* both CQEs posted, not read yet */
    CHECK_RC(rf_ring_check(&bad), 0);

    /* A tail far more than the SQ holds ahead of what the engine took. */
    __atomic_store_n(bad.sq_tail, bad.sq_published + 1000, __ATOMIC_RELEASE);
    CHECK_RC(rf_progress(w), RF_ERING_CORRUPT);
    CHECK(__atomic_load_n(bad.sq_shared_flags, __ATOMIC_ACQUIRE) & RF_SQ_FAILED);
    CHECK(__atomic_load_n(bad.cq_shared_flags, __ATOMIC_ACQUIRE) & RF_CQ_FAILED);
    __atomic_store_n(bad.sq_tail, bad.sq_published, __ATOMIC_RELEASE);
    CHECK_RC(rf_progress(w), RF_ERING_CORRUPT); /* for good */
    CHECK_RC(rf_ring_check(&bad), RF_ERING_CORRUPT);
    CHECK_RC(rf_ring_check(&good), 0);

    /* What was published before stays readable, then the failure. */
    struct rf_cqe *cqe = NULL;
    for (uint64_t i = 1; i <= 2; i++) {
        CHECK_RC(rf_peek_cqe(&bad, &cqe), 0);
        CHECK(cqe != NULL && cqe->user_data == i && cqe->res == 0);
        rf_cqe_seen(&bad, cqe);
    }
    CHECK_RC(rf_peek_cqe(&bad, &cqe), RF_ERING_CORRUPT);
    CHECK(cqe == NULL);
    struct rf_cqe *batch[4];
    CHECK_RC(rf_peek_batch_cqe(&bad, batch, 4), RF_ERING_CORRUPT);
    /* At once, not at the deadline. */
    CHECK_RC(rf_wait_cqes(&bad, 1, (int64_t)(RFT_HANG_SECONDS * 1e9)), RF_ERING_CORRUPT);
    CHECK_RC(rf_wait_cqes(&bad, 1, -1), RF_ERING_CORRUPT);
    CHECK_RC(rf_ring_cq_arm(&bad), RF_ERING_CORRUPT);
    struct rf_sqe put;
    memset(&put, 0, sizeof put);
    rf_prep_put(&put, l.ep, local, l.mem, (uint64_t)(uintptr_t)l.window, l.rkey, 8);
    int32_t res = 7;
    CHECK_RC(rf_ring_try_now(&bad, &put, &res), RF_ERING_CORRUPT);
    CHECK(res == 7);
    /* The SQ still has room by the cached head; the submit says it. */
    struct rf_sqe *sqe = rft_sqe(&bad);
    rf_prep_nop(sqe);
    CHECK_RC(rf_submit(&bad), RF_ERING_CORRUPT);
    CHECK_RC(rf_submit(&bad), RF_ERING_CORRUPT); /* nothing pending */

    /* The other ring works. */
    sqe = rft_sqe(&good);
    rf_prep_put(sqe, l.ep, local, l.mem, (uint64_t)(uintptr_t)l.window, l.rkey, 8);
    rf_sqe_set_data(sqe, 11);
    sqe = rft_sqe(&good);
    rf_prep_flush(sqe, l.ep);
    rf_sqe_set_data(sqe, 12);
    CHECK(rf_submit(&good) == 2);
    struct rf_cqe c = rft_one_cqe(w, &good);
    CHECK(c.user_data == 11 && c.res == 8);
    c = rft_one_cqe(w, &good);
    CHECK(c.user_data == 12 && c.res == 0);
    CHECK(l.window[0] == 0x5a && l.window[7] == 0x5a);

    /* Destroying the failed ring ends the worker's report. */
    CHECK_RC(rf_ring_destroy(&bad), 0);
    CHECK(rf_progress(w) >= 0);
    CHECK_RC(rf_ring_destroy(&bad), RF_ESTALE_HANDLE);
    CHECK_RC(rf_ring_check(&bad), RF_ESTALE_HANDLE);
    MUST(rf_ring_destroy(&good));
    MUST(rf_worker_destroy(w));
    MUST(rf_worker_destroy(target));
}

int main(void)
{
    RFT_RUN(nops_in_batches_wrap_in_order);
    RFT_RUN(a_full_cq_drops_nothing);
    RFT_RUN(put_and_get_through_loopback);
    RFT_RUN(bounded_waits_with_and_without_a_core_thread);
    RFT_RUN(a_worker_flush_covers_every_endpoint);
    RFT_RUN(preparing_a_close_does_not_submit);
    RFT_RUN(try_now_runs_or_declines);
    RFT_RUN(submit_wakes_a_sleeping_core_thread);
    RFT_RUN(epoll_on_the_cq_eventfd);
    RFT_RUN(a_corrupt_sq_tail_fails_the_ring);
    return rft_finish("ring");
}
