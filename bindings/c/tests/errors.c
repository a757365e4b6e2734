/*
 * Every error path of the C API with bad arguments: NULL pointers, handles
 * that are zero, forged, of the wrong kind, stale after destroy (double
 * destroy included), zero and huge lengths, bad key blobs and addresses,
 * and garbage written into ring memory. Each call must return its specific
 * status and never crash (this runs under ASan and UBSan).
 */
#include "rftest.h"

#include <errno.h>
#include <sys/wait.h>
#include <unistd.h>

static rf_worker_t loopback_worker(void)
{
    struct rf_worker_config config;
    MUST(rf_worker_config_init(&config));
    config.drivers = "loopback";
    config.ignore_env = 1;
    rf_worker_t w = 0;
    MUST(rf_worker_create(&config, &w));
    return w;
}

static void version_and_strerror(void)
{
    CHECK(rf_version() == RF_VERSION);
    CHECK(strcmp(rf_strerror(0), "success") == 0);
    CHECK(strcmp(rf_strerror(4096), "success") == 0);
    CHECK(strcmp(rf_strerror(RF_ESTALE_HANDLE), "stale handle") == 0);
    CHECK(strcmp(rf_strerror(RF_EIO), "I/O error") == 0);
    CHECK(strcmp(rf_strerror(-26), "unknown status") == 0);
    CHECK(strcmp(rf_strerror(RF_ELIBRARY_BASE), "unknown status") == 0);
    CHECK(strcmp(rf_strerror(INT32_MIN), "unknown status") == 0);
    /* Statuses with an errno counterpart are that errno, negated: strerror
       names them as liburing's users expect. */
    const struct { int status, errno_value; } errnos[] = {
        {RF_ECANCELED, ECANCELED},     {RF_EOUT_OF_BOUNDS, EFAULT},
        {RF_EACCESS_DENIED, EACCES},   {RF_EENDPOINT_CLOSED, ENOTCONN},
        {RF_ENO_RESOURCE, ENOBUFS},    {RF_ETRANSPORT, ECOMM},
        {RF_ETIMEOUT, ETIME},          {RF_EUNSUPPORTED, EOPNOTSUPP},
        {RF_EPEER_UNREACHABLE, EHOSTUNREACH}, {RF_EINVALID_ARGUMENT, EINVAL},
        {RF_ESTALE_HANDLE, ESTALE},    {RF_ENO_MEMORY, ENOMEM},
        {RF_EBUSY, EBUSY},             {RF_ETRUNCATED, EMSGSIZE},
        {RF_EIO, EIO},                 {RF_EAGAIN, EAGAIN},
    };
    for (size_t i = 0; i < sizeof errnos / sizeof errnos[0]; i++) {
        CHECK(errnos[i].status == -errnos[i].errno_value);
        CHECK(strcmp(strerror(-errnos[i].status), strerror(errnos[i].errno_value)) == 0);
        CHECK(strcmp(rf_strerror(errnos[i].status), "unknown status") != 0);
    }
    /* The library's own codes lie outside the errno range. */
    const int library[] = {RF_EINVALID_OPCODE, RF_EINVALID_FLAGS, RF_EINVALID_ENDPOINT,
                           RF_EINVALID_MEM_HANDLE, RF_EINVALID_RKEY, RF_EMISALIGNED,
                           RF_EINVALID_LENGTH, RF_EENDPOINT_FAILED, RF_ERING_CORRUPT,
                           RF_EINVALID_SUBOP};
    for (size_t i = 0; i < sizeof library / sizeof library[0]; i++) {
        CHECK(library[i] < RF_ELIBRARY_BASE);
        CHECK(strcmp(rf_strerror(library[i]), "unknown status") != 0);
    }
}

static void worker_create_refuses_bad_configs(void)
{
    struct rf_worker_config config;
    rf_worker_t w = 0;
    CHECK_RC(rf_worker_config_init(NULL), RF_EINVALID_ARGUMENT);
    CHECK_RC(rf_worker_create(NULL, NULL), RF_EINVALID_ARGUMENT);
    MUST(rf_worker_config_init(&config));
    CHECK(config.drivers == NULL && config.core_cpu == -1 && config.sq_entries == 0);
    config.ignore_env = 1;
    CHECK_RC(rf_worker_create(&config, NULL), RF_EINVALID_ARGUMENT);

    config.drivers = "no-such-driver";
    CHECK_RC(rf_worker_create(&config, &w), RF_EINVALID_ARGUMENT);
    config.drivers = "";
    CHECK_RC(rf_worker_create(&config, &w), RF_EINVALID_ARGUMENT);
    config.drivers = "loopback";
    config.reserved[3] = 1;
    CHECK_RC(rf_worker_create(&config, &w), RF_EINVALID_ARGUMENT);
    config.reserved[3] = 0;
    config.sq_entries = 3;
    CHECK_RC(rf_worker_create(&config, &w), RF_EINVALID_ARGUMENT);
    config.sq_entries = 1u << 20;
    CHECK_RC(rf_worker_create(&config, &w), RF_EINVALID_ARGUMENT);
    config.sq_entries = 0;
    /* Lanes: 1 to RF_MAX_LANES (64), one limit everywhere. */
    config.lanes = 300;
    CHECK_RC(rf_worker_create(&config, &w), RF_EINVALID_ARGUMENT);
    config.lanes = RF_MAX_LANES + 1;
    CHECK_RC(rf_worker_create(&config, &w), RF_EINVALID_ARGUMENT);
    CHECK(w == 0);
    config.lanes = RF_MAX_LANES;
    MUST(rf_worker_create(&config, &w));
    MUST(rf_worker_destroy(w));
    w = 0;
    config.lanes = 0;
    CHECK(w == 0); /* nothing was written by the failures */

    /* A string without a NUL in the first kilobyte. */
    char *long_name = (char *)malloc(2048);
    memset(long_name, 'a', 2048);
    config.drivers = long_name;
    CHECK_RC(rf_worker_create(&config, &w), RF_EINVALID_ARGUMENT);
    free(long_name);

    config.drivers = " loopback , loopback";
    CHECK_RC(rf_worker_create(&config, &w), 0);
    CHECK(w != 0);
    CHECK_RC(rf_worker_destroy(w), 0);
}

static void stale_and_forged_worker_handles(void)
{
    rf_worker_t w = loopback_worker();
    struct rf_ring ring;
    MUST(rf_ring_create(w, 8, 16, &ring));

    CHECK_RC(rf_worker_destroy(w), RF_EBUSY); /* a ring lives */
    CHECK_RC(rf_ring_destroy(&ring), 0);
    CHECK(ring.sqes == NULL && ring.cq_head == NULL && ring.handle != 0);
    CHECK_RC(rf_ring_destroy(&ring), RF_ESTALE_HANDLE); /* double destroy */
    CHECK_RC(rf_ring_wake(&ring), RF_ESTALE_HANDLE);
    CHECK_RC(rf_ring_cq_fd(&ring), RF_ESTALE_HANDLE);
    CHECK_RC(rf_ring_cq_arm(&ring), RF_ESTALE_HANDLE);
    CHECK_RC(rf_ring_cq_disarm(&ring), RF_ESTALE_HANDLE);

    CHECK_RC(rf_worker_destroy(w), 0);
    CHECK_RC(rf_worker_destroy(w), RF_ESTALE_HANDLE); /* double destroy */

    /* Every call on the destroyed worker. */
    uint8_t buf[256];
    size_t len = 0;
    uint32_t id = 0;
    void *p = NULL;
    CHECK_RC(rf_progress(w), RF_ESTALE_HANDLE);
    CHECK_RC(rf_worker_address(w, buf, sizeof buf, &len), RF_ESTALE_HANDLE);
    CHECK_RC(rf_ep_connect(w, buf, 8, &id), RF_ESTALE_HANDLE);
    CHECK_RC(rf_mem_register(w, buf, sizeof buf, &id), RF_ESTALE_HANDLE);
    CHECK_RC(rf_mem_alloc(w, 64, &p, &id), RF_ESTALE_HANDLE);
    CHECK_RC(rf_mem_deregister(w, 1), RF_ESTALE_HANDLE);
    CHECK_RC(rf_mem_free(w, 1), RF_ESTALE_HANDLE);
    CHECK_RC(rf_rkey_pack(w, 1, buf, sizeof buf, &len), RF_ESTALE_HANDLE);
    CHECK_RC(rf_rkey_unpack(w, 0, buf, 8, &id), RF_ESTALE_HANDLE);
    CHECK_RC(rf_core_thread_start(w, -1), RF_ESTALE_HANDLE);
    CHECK_RC(rf_core_thread_stop(w), RF_ESTALE_HANDLE);
    CHECK_RC(rf_ring_create(w, 0, 0, &ring), RF_ESTALE_HANDLE);

    /* A new worker reuses the slot with a new generation: the old handle
       stays stale. */
    rf_worker_t again = loopback_worker();
    CHECK(again != w);
    CHECK_RC(rf_progress(w), RF_ESTALE_HANDLE);
    CHECK(rf_progress(again) >= 0);

    /* Zero, forged, and of the wrong kind. */
    CHECK_RC(rf_progress(0), RF_EINVALID_ARGUMENT);
    CHECK_RC(rf_progress(UINT64_MAX), RF_EINVALID_ARGUMENT);
    CHECK_RC(rf_progress(0x1234), RF_EINVALID_ARGUMENT);
    CHECK_RC(rf_progress(again + 77), RF_ESTALE_HANDLE); /* right kind, no such slot */
    MUST(rf_ring_create(again, 0, 0, &ring));
    CHECK_RC(rf_progress(ring.handle), RF_EINVALID_ARGUMENT);
    CHECK_RC(rf_worker_destroy(ring.handle), RF_EINVALID_ARGUMENT);
    struct rf_ring forged = ring;
    forged.handle = again; /* a worker's handle as a ring's */
    CHECK_RC(rf_ring_wake(&forged), RF_EINVALID_ARGUMENT);
    forged.handle = 0;
    CHECK_RC(rf_ring_destroy(&forged), RF_EINVALID_ARGUMENT);
    CHECK_RC(rf_ring_destroy(NULL), RF_EINVALID_ARGUMENT);
    CHECK_RC(rf_ring_wake(NULL), RF_EINVALID_ARGUMENT);
    CHECK_RC(rf_ring_cq_fd(NULL), RF_EINVALID_ARGUMENT);
    CHECK(rf_ring_cq_fd(&ring) >= 0);
    CHECK_RC(rf_ring_destroy(&ring), 0);
    CHECK_RC(rf_worker_destroy(again), 0);
}

static void address_and_connect(void)
{
    rf_worker_t w = loopback_worker();
    uint8_t addr[512];
    size_t len = 0;
    uint32_t ep = 0;
    CHECK_RC(rf_worker_address(w, NULL, 0, NULL), RF_EINVALID_ARGUMENT);
    CHECK_RC(rf_worker_address(w, NULL, 0, &len), 0); /* size query */
    CHECK(len > 0 && len < sizeof addr);
    size_t need = len;
    CHECK_RC(rf_worker_address(w, NULL, 8, &len), RF_EINVALID_ARGUMENT);
    CHECK_RC(rf_worker_address(w, addr, need - 1, &len), RF_ETRUNCATED);
    CHECK(len == need);
    CHECK_RC(rf_worker_address(w, addr, sizeof addr, &len), 0);

    CHECK_RC(rf_ep_connect(w, NULL, len, &ep), RF_EINVALID_ARGUMENT);
    CHECK_RC(rf_ep_connect(w, addr, len, NULL), RF_EINVALID_ARGUMENT);
    CHECK_RC(rf_ep_connect(w, addr, 0, &ep), RF_EINVALID_LENGTH);
    CHECK_RC(rf_ep_connect(w, addr, RF_MAX_BLOB + 1, &ep), RF_EINVALID_LENGTH);
    CHECK_RC(rf_ep_connect(w, addr, SIZE_MAX, &ep), RF_EINVALID_LENGTH);
    CHECK_RC(rf_ep_connect(w, addr, len - 1, &ep), RF_EINVALID_ARGUMENT); /* cut short */
    uint8_t garbage[64];
    memset(garbage, 0xa5, sizeof garbage);
    CHECK_RC(rf_ep_connect(w, garbage, sizeof garbage, &ep), RF_EINVALID_ARGUMENT);
    /* Damaged on its way: every single flipped bit, and a byte added, is
       refused by the address's integrity check. */
    uint8_t damaged[512];
    for (size_t bit = 0; bit < len * 8; bit++) {
        memcpy(damaged, addr, len);
        damaged[bit / 8] ^= (uint8_t)(1u << (bit % 8));
        CHECK_RC(rf_ep_connect(w, damaged, len, &ep), RF_EINVALID_ARGUMENT);
    }
    memcpy(damaged, addr, len);
    damaged[len] = 0;
    CHECK_RC(rf_ep_connect(w, damaged, len + 1, &ep), RF_EINVALID_ARGUMENT);
    CHECK(ep == 0);
    CHECK_RC(rf_ep_connect(w, addr, len, &ep), 0); /* to itself */
    /* Loopback needs no handshake: connected at once. */
    int error = 0;
    CHECK_RC(rf_ep_state(w, ep, &error), RF_EP_CONNECTED);
    CHECK_RC(rf_ep_state(w, ep, NULL), RF_EP_CONNECTED);
    CHECK_RC(rf_ep_state(w, ep + 1000, &error), RF_EINVALID_ENDPOINT);
    CHECK(error == 0);
    CHECK_RC(rf_worker_destroy(w), 0);
    CHECK_RC(rf_ep_state(w, ep, &error), RF_ESTALE_HANDLE);
}

static void memory_registration(void)
{
    rf_worker_t w = loopback_worker();
    static uint8_t region[4096];
    uint32_t mem = 0, mem2 = 0;
    void *p = NULL;

    CHECK_RC(rf_mem_register(w, NULL, 64, &mem), RF_EINVALID_ARGUMENT);
    CHECK_RC(rf_mem_register(w, region, sizeof region, NULL), RF_EINVALID_ARGUMENT);
    CHECK_RC(rf_mem_register(w, region, 0, &mem), RF_EINVALID_LENGTH);
    CHECK_RC(rf_mem_register(w, region, SIZE_MAX, &mem), RF_EINVALID_LENGTH);
    CHECK_RC(rf_mem_register(w, region, (size_t)PTRDIFF_MAX + 1, &mem), RF_EINVALID_LENGTH);
    CHECK_RC(rf_mem_register(w, (void *)(UINTPTR_MAX - 15), 64, &mem), RF_EINVALID_LENGTH);
    CHECK(mem == 0);
    CHECK_RC(rf_mem_register(w, region, sizeof region, &mem), 0);
    CHECK(mem != 0);

    CHECK_RC(rf_mem_alloc(w, 0, &p, &mem2), RF_EINVALID_LENGTH);
    CHECK_RC(rf_mem_alloc(w, SIZE_MAX, &p, &mem2), RF_EINVALID_LENGTH);
    CHECK_RC(rf_mem_alloc(w, (size_t)1 << 62, &p, &mem2), RF_ENO_MEMORY);
    CHECK_RC(rf_mem_alloc(w, 64, NULL, &mem2), RF_EINVALID_ARGUMENT);
    CHECK_RC(rf_mem_alloc(w, 64, &p, NULL), RF_EINVALID_ARGUMENT);
    CHECK(p == NULL && mem2 == 0);
    CHECK_RC(rf_mem_alloc(w, 100, &p, &mem2), 0);
    CHECK(p != NULL && ((uintptr_t)p & 63) == 0);
    CHECK(((uint8_t *)p)[99] == 0); /* zeroed */
    memset(p, 7, 100);

    /* Keys. */
    uint8_t key[512];
    size_t len = 0;
    CHECK_RC(rf_rkey_pack(w, 0xdead, key, sizeof key, &len), RF_EINVALID_MEM_HANDLE);
    CHECK_RC(rf_rkey_pack(w, mem, key, sizeof key, NULL), RF_EINVALID_ARGUMENT);
    CHECK_RC(rf_rkey_pack(w, mem, NULL, 0, &len), 0);
    CHECK_RC(rf_rkey_pack(w, mem, key, len - 1, &len), RF_ETRUNCATED);
    CHECK_RC(rf_rkey_pack(w, mem, key, sizeof key, &len), 0);

    /* Free and deregister: each once; the wrong kind refused. */
    CHECK_RC(rf_mem_free(w, mem), RF_EINVALID_MEM_HANDLE); /* registered, not allocated */
    CHECK_RC(rf_mem_deregister(w, 0), RF_EINVALID_MEM_HANDLE);
    CHECK_RC(rf_mem_deregister(w, 0xffffffffu), RF_EINVALID_MEM_HANDLE);
    CHECK_RC(rf_mem_deregister(w, mem), 0);
    CHECK_RC(rf_mem_deregister(w, mem), RF_EINVALID_MEM_HANDLE);
    CHECK_RC(rf_rkey_pack(w, mem, key, sizeof key, &len), RF_EINVALID_MEM_HANDLE);
    CHECK_RC(rf_mem_free(w, mem2), 0);
    CHECK_RC(rf_mem_free(w, mem2), RF_EINVALID_MEM_HANDLE);
    CHECK_RC(rf_mem_deregister(w, mem2), RF_EINVALID_MEM_HANDLE);

    /* Memory still allocated at destroy is freed with the worker (ASan's
       leak check would say otherwise). */
    CHECK_RC(rf_mem_alloc(w, 4096, &p, &mem2), 0);
    CHECK_RC(rf_worker_destroy(w), 0);
}

/* Resident bytes of this process (/proc/self/statm). */
static uint64_t resident_bytes(void)
{
    unsigned long size = 0, resident = 0;
    FILE *f = fopen("/proc/self/statm", "r");
    CHECK(f != NULL);
    if (f == NULL)
        return 0;
    CHECK(fscanf(f, "%lu %lu", &size, &resident) == 2);
    fclose(f);
    return (uint64_t)resident * (uint64_t)sysconf(_SC_PAGESIZE);
}

/* Allocations and notification pools beyond what the machine (cgroup,
   rlimits) can back fail at creation with RF_ENO_MEMORY; a large pool is
   not touched when the worker is created. */
static void resource_limits(void)
{
    void *p = NULL;
    uint32_t mem = 0;
    const size_t tib = (size_t)1 << 40;
    uint64_t machine = (uint64_t)sysconf(_SC_PHYS_PAGES) * (uint64_t)sysconf(_SC_PAGESIZE);

    /* 1 TiB: on loopback (heap memory) and on the default driver (shm's
       memfd) alike. */
    rf_worker_t w = loopback_worker();
    rf_worker_t shm = 0;
    struct rf_worker_config config;
    MUST(rf_worker_config_init(&config));
    config.ignore_env = 1;
    MUST(rf_worker_create(&config, &shm));
    if (machine < tib) {
        CHECK_RC(rf_mem_alloc(w, tib, &p, &mem), RF_ENO_MEMORY);
        CHECK_RC(rf_mem_alloc(shm, tib, &p, &mem), RF_ENO_MEMORY);
        CHECK(p == NULL && mem == 0);
    } else {
        printf("resource_limits: skipped the 1 TiB case (this machine has %llu bytes)\n",
               (unsigned long long)machine);
    }
    CHECK_RC(rf_mem_alloc(shm, (size_t)1 << 20, &p, &mem), 0);
    CHECK(p != NULL && ((uint8_t *)p)[(1 << 20) - 1] == 0);
    MUST(rf_mem_free(shm, mem));
    MUST(rf_worker_destroy(shm));
    MUST(rf_worker_destroy(w));

    /* 65,536 buffers of 4 GiB - 1: 256 TiB of notification pool. */
    rf_worker_t big = 0;
    config.drivers = "loopback";
    config.notify_buffers = 65536;
    config.notify_size = UINT32_MAX;
    CHECK_RC(rf_worker_create(&config, &big), RF_ENO_MEMORY);
    CHECK(big == 0);

    /* 65,536 x 64 KiB (4 GiB) builds without making it resident. */
    const uint64_t pool = (uint64_t)65536 * 65536;
    if (machine < 2 * pool) {
        printf("resource_limits: skipped the 4 GiB pool (this machine has %llu bytes)\n",
               (unsigned long long)machine);
        return;
    }
    config.notify_size = 65536;
    uint64_t before = resident_bytes();
    int rc = rf_worker_create(&config, &big);
    if (rc == RF_ENO_MEMORY) {
        /* The library's limit is also the cgroup's and the rlimits. */
        printf("resource_limits: skipped the 4 GiB pool (a memory limit below it)\n");
        return;
    }
    CHECK_RC(rc, 0);
    uint64_t after = resident_bytes();
    uint64_t grown = after > before ? after - before : 0;
    CHECK(grown < pool / 16);
    MUST(rf_worker_destroy(big));
}

static void rkey_unpack_refuses_bad_blobs(void)
{
    rf_worker_t target = loopback_worker(), w = loopback_worker();
    uint8_t addr[512], key[512];
    size_t addr_len = 0, key_len = 0;
    uint32_t ep = 0, mem = 0, rkey = 0;
    void *window = NULL;
    MUST(rf_worker_address(target, addr, sizeof addr, &addr_len));
    MUST(rf_mem_alloc(target, 4096, &window, &mem));
    MUST(rf_rkey_pack(target, mem, key, sizeof key, &key_len));
    MUST(rf_ep_connect(w, addr, addr_len, &ep));

    CHECK_RC(rf_rkey_unpack(w, ep, NULL, key_len, &rkey), RF_EINVALID_ARGUMENT);
    CHECK_RC(rf_rkey_unpack(w, ep, key, key_len, NULL), RF_EINVALID_ARGUMENT);
    CHECK_RC(rf_rkey_unpack(w, ep, key, 0, &rkey), RF_EINVALID_LENGTH);
    CHECK_RC(rf_rkey_unpack(w, ep, key, SIZE_MAX, &rkey), RF_EINVALID_LENGTH);
    CHECK_RC(rf_rkey_unpack(w, ep + 1000, key, key_len, &rkey), RF_EINVALID_ENDPOINT);
    CHECK_RC(rf_rkey_unpack(w, ep, key, key_len - 1, &rkey), RF_EINVALID_ARGUMENT);
    uint8_t bad[512];
    memset(bad, 0x5a, sizeof bad);
    CHECK_RC(rf_rkey_unpack(w, ep, bad, sizeof bad, &rkey), RF_EINVALID_ARGUMENT);
    /* Damaged on its way: every single flipped bit (the secret and the
       bounds among them) and a byte added are refused at unpack by the
       key's integrity check, before the target is asked anything. */
    for (size_t bit = 0; bit < key_len * 8; bit++) {
        memcpy(bad, key, key_len);
        bad[bit / 8] ^= (uint8_t)(1u << (bit % 8));
        CHECK_RC(rf_rkey_unpack(w, ep, bad, key_len, &rkey), RF_EINVALID_ARGUMENT);
    }
    memcpy(bad, key, key_len);
    bad[key_len] = 0;
    CHECK_RC(rf_rkey_unpack(w, ep, bad, key_len + 1, &rkey), RF_EINVALID_ARGUMENT);
    CHECK(rkey == 0);
    CHECK_RC(rf_rkey_unpack(w, ep, key, key_len, &rkey), 0);
    CHECK(rkey != 0);

    /* Released: the id is stale, a second release refused, and the
       next unpack hands out a new id. */
    uint64_t base = 0, len = 0;
    CHECK_RC(rf_rkey_release(w, rkey), 0);
    CHECK_RC(rf_rkey_release(w, rkey), RF_EINVALID_RKEY);
    CHECK_RC(rf_rkey_release(w, 0), RF_EINVALID_RKEY);
    CHECK_RC(rf_rkey_bounds(w, ep, rkey, &base, &len), RF_EINVALID_RKEY);
    uint32_t again = 0;
    CHECK_RC(rf_rkey_unpack(w, ep, key, key_len, &again), 0);
    CHECK(again != 0 && again != rkey);
    CHECK_RC(rf_rkey_bounds(w, ep, again, &base, &len), 0);
    CHECK(len == 4096);

    CHECK_RC(rf_worker_destroy(w), 0);
    CHECK_RC(rf_rkey_release(w, again), RF_ESTALE_HANDLE);
    CHECK_RC(rf_worker_destroy(target), 0);
}

static void rings_and_core_thread(void)
{
    rf_worker_t w = loopback_worker();
    struct rf_ring ring;
    memset(&ring, 0, sizeof ring);
    CHECK_RC(rf_ring_create(w, 0, 0, NULL), RF_EINVALID_ARGUMENT);
    CHECK_RC(rf_ring_create(w, 3, 0, &ring), RF_EINVALID_ARGUMENT);
    CHECK_RC(rf_ring_create(w, 8, 1u << 17, &ring), RF_EINVALID_ARGUMENT);
    CHECK(ring.handle == 0);
    CHECK_RC(rf_ring_create(w, 8, 0, &ring), 0);
    CHECK(ring.sq_entries == 8 && ring.cq_entries == 16 && ring.sq_mask == 7);

    CHECK_RC(rf_core_thread_start(w, 1 << 20), RF_EIO); /* no such CPU */
    CHECK_RC(rf_core_thread_start(w, -1), 0);
    CHECK_RC(rf_core_thread_start(w, -1), RF_EBUSY);
    CHECK_RC(rf_core_thread_stop(w), 0);
    CHECK_RC(rf_core_thread_stop(w), 0); /* none runs: nothing to do */

    /* Notifications: only notification CQEs, read once. */
    struct rf_cqe plain = {7, 0, 0};
    uint8_t buf[64];
    size_t len = 0;
    CHECK_RC(rf_notification_read(&ring, NULL, buf, sizeof buf, &len), RF_EINVALID_ARGUMENT);
    CHECK_RC(rf_notification_read(&ring, &plain, buf, sizeof buf, NULL), RF_EINVALID_ARGUMENT);
    CHECK_RC(rf_notification_read(&ring, &plain, NULL, 0, &len), RF_EINVALID_ARGUMENT);
    CHECK_RC(rf_notification_read(&ring, &plain, buf, sizeof buf, &len), RF_EINVALID_ARGUMENT);
    struct rf_cqe forged = {7, 12, RF_CQE_NOTIFICATION | (3u << RF_CQE_BUFFER_SHIFT)};
    CHECK_RC(rf_notification_read(&ring, &forged, buf, sizeof buf, &len), RF_EINVALID_ARGUMENT);
    forged.res = -5;
    CHECK_RC(rf_notification_read(&ring, &forged, buf, sizeof buf, &len), RF_EINVALID_ARGUMENT);
    forged.res = 100;
    CHECK_RC(rf_notification_read(&ring, &forged, buf, 10, &len), RF_ETRUNCATED);
    CHECK(len == 100);

    CHECK_RC(rf_ring_destroy(&ring), 0);
    CHECK_RC(rf_worker_destroy(w), 0);
}

/* Garbage in ring memory is detected: bad SQEs complete with an error
   status, corrupt indices are errors. */
static void garbage_in_ring_memory(void)
{
    rf_worker_t target = loopback_worker(), w = loopback_worker();
    uint8_t addr[512], key[512];
    size_t addr_len = 0, key_len = 0;
    uint32_t ep = 0, window_mem = 0, src_mem = 0, rkey = 0;
    void *window = NULL, *src = NULL;
    MUST(rf_worker_address(target, addr, sizeof addr, &addr_len));
    MUST(rf_mem_alloc(target, 4096, &window, &window_mem));
    MUST(rf_rkey_pack(target, window_mem, key, sizeof key, &key_len));
    MUST(rf_ep_connect(w, addr, addr_len, &ep));
    MUST(rf_rkey_unpack(w, ep, key, key_len, &rkey));
    MUST(rf_mem_alloc(w, 4096, &src, &src_mem));
    uint64_t base = (uint64_t)(uintptr_t)window;
    struct rf_ring ring;
    MUST(rf_ring_create(w, 16, 32, &ring));

    struct {
        int want;
        uint8_t opcode, flags, subop, reserved0;
        uint32_t ep, len, mem;
        uint64_t local_off, remote;
        uint32_t rkey, reserved1;
    } cases[] = {
        {RF_EINVALID_OPCODE, 0xee, 0, 0, 0, ep, 8, src_mem, 0, base, rkey, 0},
        {RF_EINVALID_FLAGS, RF_OP_PUT, 0x80, 0, 0, ep, 8, src_mem, 0, base, rkey, 0},
        {RF_EINVALID_ARGUMENT, RF_OP_PUT, 0, 0, 1, ep, 8, src_mem, 0, base, rkey, 0},
        {RF_EINVALID_ARGUMENT, RF_OP_PUT, 0, 0, 0, ep, 8, src_mem, 0, base, rkey, 9},
        {RF_EINVALID_ENDPOINT, RF_OP_PUT, 0, 0, 0, ep + 99, 8, src_mem, 0, base, rkey, 0},
        {RF_EINVALID_MEM_HANDLE, RF_OP_PUT, 0, 0, 0, ep, 8, 0xbad, 0, base, rkey, 0},
        {RF_EINVALID_RKEY, RF_OP_PUT, 0, 0, 0, ep, 8, src_mem, 0, base, rkey + 99, 0},
        {RF_EOUT_OF_BOUNDS, RF_OP_PUT, 0, 0, 0, ep, 8, src_mem, 0, base + 4090, rkey, 0},
        {RF_EOUT_OF_BOUNDS, RF_OP_GET, 0, 0, 0, ep, 8, src_mem, 4092, base, rkey, 0},
        {RF_EINVALID_LENGTH, RF_OP_PUT, 0, 0, 0, ep, 0, src_mem, 0, base, rkey, 0},
        {RF_EMISALIGNED, RF_OP_ATOMIC, 0, RF_ATOMIC_FADD, 0, ep, 8, src_mem, 0, base + 4, rkey, 0},
        {RF_EINVALID_SUBOP, RF_OP_ATOMIC, 0, 0x77, 0, ep, 8, src_mem, 0, base, rkey, 0},
        {RF_EINVALID_SUBOP, RF_OP_FENCE, 0, 0x77, 0, ep, 0, 0, 0, 0, 0, 0},
    };
    size_t n = sizeof cases / sizeof cases[0];
    for (size_t i = 0; i < n; i++) {
        struct rf_sqe *sqe = rft_sqe(&ring);
        rf_prep_nop(sqe); /* every field written, then the garbage */
        sqe->opcode = cases[i].opcode;
        sqe->flags = cases[i].flags;
        sqe->subop = cases[i].subop;
        sqe->reserved0 = cases[i].reserved0;
        sqe->endpoint = cases[i].ep;
        sqe->len = cases[i].len;
        sqe->local_mem = cases[i].mem;
        /* No local memory named: no local address either (a FENCE uses
           neither; a non-zero one would be RF_EINVALID_ARGUMENT). */
        sqe->local_addr = cases[i].mem ? (uint64_t)(uintptr_t)src + cases[i].local_off : 0;
        sqe->remote_addr = cases[i].remote;
        sqe->rkey = cases[i].rkey;
        sqe->reserved1 = cases[i].reserved1;
        sqe->user_data = i;
        CHECK(rf_submit(&ring) == 1);
        struct rf_cqe c = rft_one_cqe(w, &ring);
        CHECK(c.user_data == i);
        if (c.res != cases[i].want)
            fprintf(stderr, "case %zu: res %d (%s), want %d\n", i, c.res, rf_strerror(c.res),
                    cases[i].want);
        CHECK(c.res == cases[i].want);
    }

    /* A field the opcode does not use is not zero: a PUT with an operand2
       (or an operand) is refused, not run; rf_ring_try_now declines it and
       the CQE says why. The window is untouched; the same PUT without the
       garbage runs. */
    memset(window, 0x11, 64);
    memset(src, 0x22, 64);
    for (int which = 0; which < 3; which++) {
        struct rf_sqe *sqe = rft_sqe(&ring);
        rf_prep_put(sqe, ep, src, src_mem, base, rkey, 8);
        if (which == 0)
            sqe->operand2 = 1;
        else if (which == 1)
            sqe->operand = (uint64_t)1 << 63;
        else
            sqe->reserved1 = 1 << 4;
        sqe->user_data = 100 + (uint64_t)which;
        struct rf_sqe copy = *sqe;
        /* The SQE taken is pending: submit it, then ask try_now about the
           copy (declined while nothing is pending too). */
        CHECK(rf_submit(&ring) == 1);
        struct rf_cqe c = rft_one_cqe(w, &ring);
        CHECK(c.user_data == 100 + (uint64_t)which);
        CHECK(c.res == RF_EINVALID_ARGUMENT);
        int32_t res = 12345;
        CHECK_RC(rf_ring_try_now(&ring, &copy, &res), 0);
        CHECK(res == 12345);
    }
    CHECK(((uint8_t *)window)[0] == 0x11 && ((uint8_t *)window)[7] == 0x11);
    struct rf_sqe good;
    rf_prep_put(&good, ep, src, src_mem, base, rkey, 8);
    int32_t res = 0;
    int ran = rf_ring_try_now(&ring, &good, &res);
    CHECK(ran == 0 || ran == 1);
    if (ran == 0) {
        struct rf_sqe *sqe = rft_sqe(&ring);
        *sqe = good;
        CHECK(rf_submit(&ring) == 1);
        res = rft_one_cqe(w, &ring).res;
    }
    CHECK(res == 8);
    CHECK(((uint8_t *)window)[0] == 0x22 && ((uint8_t *)window)[7] == 0x22);

    /* A corrupt CQ tail: the peek says so and reads nothing. */
    uint32_t saved = __atomic_load_n(ring.cq_shared_tail, __ATOMIC_ACQUIRE);
    __atomic_store_n(ring.cq_shared_tail, saved + 1000, __ATOMIC_RELEASE);
    struct rf_cqe *cqe = NULL;
    struct rf_cqe *batch[4];
    CHECK_RC(rf_peek_cqe(&ring, &cqe), RF_ERING_CORRUPT);
    CHECK(cqe == NULL);
    CHECK_RC(rf_peek_batch_cqe(&ring, batch, 4), RF_ERING_CORRUPT);
    CHECK_RC(rf_ring_cq_arm(&ring), RF_ERING_CORRUPT);
    __atomic_store_n(ring.cq_shared_tail, saved, __ATOMIC_RELEASE);
    CHECK_RC(rf_peek_cqe(&ring, &cqe), RF_EAGAIN);

    /* A corrupt SQ head: rf_get_sqe hands out nothing once its cache runs
       out, and the engine fails the ring instead of reading garbage (it
       alone writes that head: when the SQ looks empty it checks it). */
    __atomic_store_n(ring.sq_shared_head, ring.sq_local_tail + 1000, __ATOMIC_RELEASE);
    int handed = 0;
    while (rf_get_sqe(&ring) != NULL && handed < 100)
        handed++;
    CHECK(handed <= 16);
    CHECK_RC(rf_progress(w), RF_ERING_CORRUPT);
    CHECK_RC(rf_ring_check(&ring), RF_ERING_CORRUPT);
    CHECK(__atomic_load_n(ring.sq_shared_flags, __ATOMIC_ACQUIRE) & RF_SQ_FAILED);

    /* A corrupt SQ tail on the failed ring changes nothing: progress goes
       on for the worker's other rings (reporting the failed one) and
       nothing crashes. */
    struct rf_ring other;
    MUST(rf_ring_create(w, 8, 16, &other));
    __atomic_store_n(ring.sq_tail, ring.sq_published + 100000, __ATOMIC_RELEASE);
    CHECK_RC(rf_progress(w), RF_ERING_CORRUPT);
    CHECK_RC(rf_ring_check(&other), 0);
    struct rf_sqe *sqe = rft_sqe(&other);
    rf_prep_nop(sqe);
    rf_sqe_set_data(sqe, 99);
    rf_submit(&other);
    struct rf_cqe c = rft_one_cqe(w, &other);
    CHECK(c.user_data == 99 && c.res == 0);

    CHECK_RC(rf_ring_destroy(&other), 0);
    CHECK_RC(rf_ring_destroy(&ring), 0);
    CHECK_RC(rf_worker_destroy(w), 0);
    CHECK_RC(rf_worker_destroy(target), 0);
}

/* In a child of fork(), every handle the parent created is stale: calls
   on them, destroy included, return RF_ESTALE_HANDLE and touch nothing
   (the parent's rings and connections are shared with the child's copy);
   a worker the child creates works. The parent's worker is unharmed. */
static void a_forked_child_cannot_use_the_parents_worker(void)
{
    rf_worker_t w = loopback_worker();
    struct rf_ring ring;
    MUST(rf_ring_create(w, 0, 0, &ring));
    rf_prep_nop(rft_sqe(&ring));
    rf_submit(&ring);
    fflush(stdout);
    pid_t child = fork();
    CHECK(child >= 0);
    if (child == 0) {
        int bad = 0;
        bad += rf_progress(w) != RF_ESTALE_HANDLE;
        bad += rf_ring_wake(&ring) != RF_ESTALE_HANDLE;
        bad += rf_ring_destroy(&ring) != RF_ESTALE_HANDLE;
        bad += rf_worker_destroy(w) != RF_ESTALE_HANDLE;
        struct rf_worker_config config;
        bad += rf_worker_config_init(&config) != 0;
        config.drivers = "loopback";
        config.ignore_env = 1;
        rf_worker_t mine = 0;
        bad += rf_worker_create(&config, &mine) != 0;
        struct rf_ring own;
        bad += rf_ring_create(mine, 0, 0, &own) != 0;
        rf_prep_nop(rft_sqe(&own));
        rf_submit(&own);
        bad += rf_wait_cqes(&own, 1, (int64_t)RFT_HANG_SECONDS * 1000000000) < 1;
        bad += rf_ring_destroy(&own) != 0;
        bad += rf_worker_destroy(mine) != 0;
        _exit(bad == 0 ? 0 : 1);
    }
    int status = 0;
    CHECK(waitpid(child, &status, 0) == child);
    CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    /* The parent's NOP is still its own to complete. */
    struct rf_cqe c = rft_one_cqe(w, &ring);
    CHECK(c.res == 0);
    MUST(rf_ring_destroy(&ring));
    MUST(rf_worker_destroy(w));
}

int main(void)
{
    RFT_RUN(version_and_strerror);
    RFT_RUN(worker_create_refuses_bad_configs);
    RFT_RUN(stale_and_forged_worker_handles);
    RFT_RUN(address_and_connect);
    RFT_RUN(memory_registration);
    RFT_RUN(resource_limits);
    RFT_RUN(rkey_unpack_refuses_bad_blobs);
    RFT_RUN(rings_and_core_thread);
    RFT_RUN(garbage_in_ring_memory);
    RFT_RUN(a_forked_child_cannot_use_the_parents_worker);
    return rft_finish("errors");
}
