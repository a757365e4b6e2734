#include <ringfence.h>
#include <stdio.h>
#include <string.h>

#define CHECK(call) do { int rc_ = (call); if (rc_ < 0) { \
    fprintf(stderr, "%s: %s\n", #call, rf_strerror(rc_)); return 1; } } while (0)

int main(void)
{
    struct rf_worker_config config;
    CHECK(rf_worker_config_init(&config));            /* zero = defaults */
    config.drivers = "shm";
    rf_worker_t w;
    CHECK(rf_worker_create(&config, &w));
    void *window, *src;                               /* registered, zeroed */
    uint32_t window_mem, src_mem, ep, rkey;
    CHECK(rf_mem_alloc(w, 4096, &window, &window_mem));
    CHECK(rf_mem_alloc(w, 64, &src, &src_mem));
    uint8_t addr[512], key[512];                      /* what a peer gets out of band */
    size_t addr_len, key_len;
    CHECK(rf_worker_address(w, addr, sizeof addr, &addr_len));
    CHECK(rf_rkey_pack(w, window_mem, key, sizeof key, &key_len));
    CHECK(rf_ep_connect(w, addr, addr_len, &ep));     /* here: to itself */
    CHECK(rf_rkey_unpack(w, ep, key, key_len, &rkey));
    uint64_t base, len;                               /* the window's address at the target */
    CHECK(rf_rkey_bounds(w, ep, rkey, &base, &len));

    struct rf_ring ring;                              /* one per thread */
    CHECK(rf_ring_create(w, 0, 0, &ring));
    memset(src, 0x5a, 64);
    rf_prep_put(rf_get_sqe(&ring), ep, src, src_mem, base, rkey, 64);
    rf_submit(&ring);
    struct rf_cqe *cqe;
    while (rf_peek_cqe(&ring, &cqe) != 0)
        CHECK(rf_progress(w));                        /* or config.core_thread = 1 */
    CHECK(cqe->res);                                  /* bytes, or an RF_E… status */
    rf_cqe_seen(&ring, cqe);
    int landed = memcmp(window, src, 64) == 0;
    CHECK(rf_ring_destroy(&ring));
    CHECK(rf_worker_destroy(w));                      /* frees its memory too */
    return landed ? 0 : 1;
}
