// ringfence.h from C++17: the header (inline helpers included) compiles
// with g++ -std=c++17 -Wall -Wextra -Werror, and a NOP goes round a ring.
#include "ringfence.h"

#include <cstdio>
#include <type_traits>

static_assert(std::is_standard_layout<rf_ring>::value, "struct rf_ring is plain C");
static_assert(sizeof(rf_sqe) == 64 && alignof(rf_sqe) == 64, "struct rf_sqe");
static_assert(sizeof(rf_cqe) == 16, "struct rf_cqe");

int main()
{
    rf_worker_config config;
    if (rf_worker_config_init(&config) != 0)
        return 1;
    config.drivers = "loopback";
    config.ignore_env = 1;
    rf_worker_t worker = 0;
    rf_ring ring;
    if (rf_worker_create(&config, &worker) != 0 || rf_ring_create(worker, 0, 0, &ring) != 0)
        return 1;
    rf_sqe *sqe = rf_get_sqe(&ring);
    rf_prep_nop(sqe);
    rf_sqe_set_data(sqe, 42);
    rf_submit(&ring);
    rf_cqe *cqe = nullptr;
    int ok = 0;
    for (int i = 0; i < 1000000 && !ok; i++) {
        rf_progress(worker);
        if (rf_peek_cqe(&ring, &cqe) == 0) {
            ok = cqe->user_data == 42 && cqe->res == 0;
            rf_cqe_seen(&ring, cqe);
        }
    }
    rf_ring_destroy(&ring);
    rf_worker_destroy(worker);
    std::printf("test cxx_header_compiles_and_runs ... %s\n", ok ? "ok" : "FAILED");
    std::printf("cxx_header: test result: %s. %d passed; %d failed\n", ok ? "ok" : "FAILED",
                ok, !ok);
    return ok ? 0 : 1;
}
