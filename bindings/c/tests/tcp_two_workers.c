/*
 * The "tcp" driver from C: a target worker with its core thread (over tcp
 * the target must make progress) and an initiator in one process, over
 * loopback. rf_ep_connect returns at once; SQEs submitted while the
 * endpoint connects queue and run when it is up.
 */
#include "rftest.h"

#define WINDOW (1u << 20)

static rf_worker_t tcp_worker(int core_thread)
{
    struct rf_worker_config config;
    MUST(rf_worker_config_init(&config));
    config.drivers = "tcp";
    config.ignore_env = 1;
    config.core_thread = core_thread ? 1 : 0;
    rf_worker_t w = 0;
    MUST(rf_worker_create(&config, &w));
    return w;
}

static void put_flush_get_over_tcp(void)
{
    rf_worker_t target = tcp_worker(1);
    rf_worker_t initiator = tcp_worker(0);
    uint8_t *window = NULL, *src = NULL, *dst = NULL;
    uint32_t window_mem = 0, src_mem = 0, dst_mem = 0;
    MUST(rf_mem_alloc(target, WINDOW, (void **)&window, &window_mem));
    MUST(rf_mem_alloc(initiator, WINDOW, (void **)&src, &src_mem));
    MUST(rf_mem_alloc(initiator, WINDOW, (void **)&dst, &dst_mem));
    uint8_t addr[256], key[256];
    size_t addr_len = 0, key_len = 0;
    MUST(rf_worker_address(target, addr, sizeof addr, &addr_len));
    MUST(rf_rkey_pack(target, window_mem, key, sizeof key, &key_len));

    uint32_t ep = 0, rkey = 0;
    MUST(rf_ep_connect(initiator, addr, addr_len, &ep));
    MUST(rf_rkey_unpack(initiator, ep, key, key_len, &rkey));
    int error = 0;
    int state = rf_ep_state(initiator, ep, &error);
    CHECK(state == RF_EP_CONNECTING || state == RF_EP_CONNECTED);

    struct rf_ring ring;
    MUST(rf_ring_create(initiator, 0, 0, &ring));
    for (uint32_t i = 0; i < WINDOW; i++)
        src[i] = (uint8_t)(i * 7 + 1);
    /* Submitted at once, whatever the handshake's state. */
    struct rf_sqe *sqe = rft_sqe(&ring);
    rf_prep_put(sqe, ep, src, src_mem, (uint64_t)(uintptr_t)window, rkey, WINDOW);
    sqe->user_data = 1;
    sqe = rft_sqe(&ring);
    rf_prep_flush(sqe, ep);
    sqe->user_data = 2;
    sqe = rft_sqe(&ring);
    rf_prep_get(sqe, ep, dst, dst_mem, (uint64_t)(uintptr_t)window, rkey, 4096);
    sqe->user_data = 3;
    CHECK(rf_submit(&ring) == 3);
    int seen = 0;
    for (int i = 0; i < 3; i++) {
        struct rf_cqe cqe = rft_one_cqe(initiator, &ring);
        CHECK(cqe.user_data >= 1 && cqe.user_data <= 3);
        CHECK(cqe.res >= 0);
        seen |= 1 << cqe.user_data;
    }
    CHECK(seen == 0xe);
    CHECK(rf_ep_state(initiator, ep, &error) == RF_EP_CONNECTED);
    CHECK(memcmp(window, src, WINDOW) == 0);
    CHECK(memcmp(dst, src, 4096) == 0);

    MUST(rf_ring_destroy(&ring));
    MUST(rf_worker_destroy(initiator));
    MUST(rf_worker_destroy(target));
}

static void connect_to_a_closed_port_fails_the_endpoint(void)
{
    rf_worker_t target = tcp_worker(0);
    uint8_t addr[256];
    size_t addr_len = 0;
    MUST(rf_worker_address(target, addr, sizeof addr, &addr_len));
    /* The target goes away: its port refuses connections. */
    MUST(rf_worker_destroy(target));
    rf_worker_t initiator = tcp_worker(0);
    uint32_t ep = 0;
    MUST(rf_ep_connect(initiator, addr, addr_len, &ep));
    double deadline = rft_now() + RFT_HANG_SECONDS;
    int error = 0, state;
    for (uint64_t spins = 0;
         (state = rf_ep_state(initiator, ep, &error)) == RF_EP_CONNECTING; spins++) {
        rf_progress(initiator);
        if (rft_now() > deadline)
            break;
        rft_pause(spins);
    }
    CHECK(state == RF_EP_FAILED);
    CHECK_RC(error, RF_EPEER_UNREACHABLE);
    MUST(rf_worker_destroy(initiator));
}

int main(void)
{
    RFT_RUN(put_flush_get_over_tcp);
    RFT_RUN(connect_to_a_closed_port_fails_the_endpoint);
    return rft_finish("tcp_two_workers");
}
