/*
 * ---------------------------------------------------------------------------
 * The inline ring helpers (hand-written: bindings/c/src/inline.h).
 *
 * A thread writes SQEs straight into its ring's SQ and reads CQEs straight
 * out of its CQ, as with liburing; no library call per operation:
 *
 *     struct rf_sqe *sqe = rf_get_sqe(&ring);          // NULL: SQ full
 *     rf_prep_put(sqe, ep, src, src_mem, remote, rkey, 8);  // all 64 bytes
 *     rf_sqe_set_data(sqe, 42);
 *     rf_submit(&ring);                                // one release store
 *     rf_progress(worker);                             // or a core thread
 *     struct rf_cqe *cqe;
 *     while (rf_peek_cqe(&ring, &cqe) == 0) { use(cqe); rf_cqe_seen(&ring, cqe); }
 *
 * Memory ordering. These helpers are the application side of the ring
 * protocol of ring/src/producer.rs (SQ) and ring/src/consumer.rs (CQ), step
 * for step; each ordered access names the Rust function it mirrors and the
 * access it pairs with:
 *
 *   word                  written by      read by      ordering
 *   *sq_tail              rf_submit       engine       release store / acquire load
 *   *sq_shared_head       engine          rf_get_sqe   release store / acquire load
 *   *sq_shared_flags      engine          rf_submit    relaxed, SeqCst fence on each side
 *   *cq_shared_tail       engine          rf_peek_*    release store / acquire load
 *   *cq_head              rf_cq_advance   engine       release store / acquire load
 *   *cq_shared_flags      engine          rf_cq_overflowed, rf_peek_* (empty)   release store / acquire load
 *
 * Each side keeps its own index locally (sq_local_tail, cq_local_head) and
 * reads the peer's through a cache (sq_cached_head, cq_cached_tail) that is
 * reloaded only when it says full or empty. Shared indices are checked:
 * one that contradicts the local index is RF_ERING_CORRUPT (or a NULL SQE),
 * never an access outside the ring.
 *
 * A failed ring. When the engine finds this ring's memory corrupt (an
 * index that cannot be, garbage over the index lines) it fails the ring,
 * and only this ring: it publishes the CQEs it had pushed, sets RF_SQ_FAILED
 * in *sq_shared_flags and RF_CQ_FAILED in *cq_shared_flags (release stores,
 * never cleared), and from then on takes no SQE and posts no CQE here. The
 * helpers look at the flags only on their slow paths: rf_submit (whose flag
 * load is there anyway) returns RF_ERING_CORRUPT; rf_peek_cqe and
 * rf_peek_batch_cqe return the CQEs published before, then RF_ERING_CORRUPT
 * once the CQ is empty; rf_get_sqe returns NULL once the SQ looks full.
 * rf_wait_cqes, rf_ring_check, rf_ring_try_now and rf_progress (for the
 * worker, while the ring is not destroyed) say RF_ERING_CORRUPT too. Then
 * rf_ring_destroy it; the worker's other rings keep working.
 *
 * What the application may assume: every CQE it read is the one completion
 * of its SQE. Every other SQE submitted on a failed ring gets no completion,
 * ever: the engine did not take it, or took it and dropped its CQE (the
 * engine still finishes what it had taken, and frees its request slots);
 * whether it took effect at the target is unknown. A flush of their
 * endpoint (or a worker flush) submitted on another ring completes only
 * after them; their memory stays held as for any operation in flight.
 *
 * Why GCC/Clang __atomic builtins rather than <stdatomic.h>: the header
 * must compile as C11 and as C++17, and <stdatomic.h> is not usable from
 * C++ before C++23 (g++ 12 rejects it), while the words live in memory
 * that Rust declares as AtomicU32 and C sees as uint32_t. The builtins are
 * what C11's atomic_load_explicit / atomic_store_explicit /
 * atomic_thread_fence compile to, with the same C11 memory model orderings
 * (__ATOMIC_ACQUIRE = memory_order_acquire, and so on), on plain uint32_t,
 * in both languages.
 *
 * Memory shared with a peer (the rules of the ringfence crate docs'
 * section of that name, for C). The ring's index words are only ever
 * accessed with the __atomic builtins above. An SQE is written in place
 * between rf_get_sqe and rf_submit: the slot is this thread's until it is
 * published, and the engine only reads SQ slots. A CQE is read in place:
 * the engine writes a slot only before publishing it, and not again until
 * rf_cq_advance frees it; the helpers read no CQE field but the one load
 * of `flags` in rf_cqe_buffer_id. Where the ring's memory is shared with a
 * process you do not trust, copy a CQE out (struct rf_cqe c = *cqe;) and
 * use only the copy: never read a shared field twice and trust it.
 * Registered memory is written by peers at any time: a word that a peer
 * PUTs (an aligned 1, 2, 4 or 8-byte PUT lands as one atomic store) or
 * updates with atomics is read with one atomic load (rf_load_u64 for 8
 * bytes), never with two plain reads; other bytes are copied out
 * (memcpy) after the completion or notification that says the peer's
 * writes are done, and only the copy is looked at.
 *
 * A ring belongs to one thread at a time. Using these helpers after
 * rf_ring_destroy, or on a struct rf_ring that rf_ring_create did not fill,
 * is undefined (they dereference its pointers).
 * ---------------------------------------------------------------------------
 */
#ifndef RINGFENCE_INLINE_H
#define RINGFENCE_INLINE_H

#ifdef __cplusplus
#define RF_STATIC_ASSERT(cond, msg) static_assert(cond, msg)
#define RF_ALIGNOF(type) alignof(type)
#else
#define RF_STATIC_ASSERT(cond, msg) _Static_assert(cond, msg)
#define RF_ALIGNOF(type) _Alignof(type)
#endif

/* The entries are ABI: the same sizes and offsets as the Rust Sqe and Cqe
   (ring/src/sqe.rs, ring/src/cqe.rs; asserted on the Rust side too). */
RF_STATIC_ASSERT(sizeof(struct rf_sqe) == 64, "struct rf_sqe is 64 bytes");
RF_STATIC_ASSERT(RF_ALIGNOF(struct rf_sqe) == 64, "struct rf_sqe is one 64-byte line");
RF_STATIC_ASSERT(offsetof(struct rf_sqe, opcode) == 0, "rf_sqe.opcode");
RF_STATIC_ASSERT(offsetof(struct rf_sqe, flags) == 1, "rf_sqe.flags");
RF_STATIC_ASSERT(offsetof(struct rf_sqe, subop) == 2, "rf_sqe.subop");
RF_STATIC_ASSERT(offsetof(struct rf_sqe, reserved0) == 3, "rf_sqe.reserved0");
RF_STATIC_ASSERT(offsetof(struct rf_sqe, endpoint) == 4, "rf_sqe.endpoint");
RF_STATIC_ASSERT(offsetof(struct rf_sqe, len) == 8, "rf_sqe.len");
RF_STATIC_ASSERT(offsetof(struct rf_sqe, local_mem) == 12, "rf_sqe.local_mem");
RF_STATIC_ASSERT(offsetof(struct rf_sqe, local_addr) == 16, "rf_sqe.local_addr");
RF_STATIC_ASSERT(offsetof(struct rf_sqe, remote_addr) == 24, "rf_sqe.remote_addr");
RF_STATIC_ASSERT(offsetof(struct rf_sqe, rkey) == 32, "rf_sqe.rkey");
RF_STATIC_ASSERT(offsetof(struct rf_sqe, reserved1) == 36, "rf_sqe.reserved1");
RF_STATIC_ASSERT(offsetof(struct rf_sqe, operand) == 40, "rf_sqe.operand");
RF_STATIC_ASSERT(offsetof(struct rf_sqe, operand2) == 48, "rf_sqe.operand2");
RF_STATIC_ASSERT(offsetof(struct rf_sqe, user_data) == 56, "rf_sqe.user_data");
RF_STATIC_ASSERT(sizeof(struct rf_cqe) == 16, "struct rf_cqe is 16 bytes");
RF_STATIC_ASSERT(offsetof(struct rf_cqe, user_data) == 0, "rf_cqe.user_data");
RF_STATIC_ASSERT(offsetof(struct rf_cqe, res) == 8, "rf_cqe.res");
RF_STATIC_ASSERT(offsetof(struct rf_cqe, flags) == 12, "rf_cqe.flags");

/* ------------------------------------------------------------------ SQ */

/*
 * The next free SQ slot, to fill in place (Producer::next_entry); it counts
 * as pushed and is published by the next rf_submit. NULL when the SQ is
 * full (submit, run progress, reap CQEs, and retry), its shared head is
 * corrupt, or the ring failed (rf_submit then returns RF_ERING_CORRUPT).
 *
 * The slot still holds an old SQE, as with liburing's io_uring_get_sqe:
 * fill it with one rf_prep_* call, which writes all 64 bytes, and only then
 * with rf_sqe_set_*. (Zeroing it here too costs about 4% of the 8-byte PUT
 * rate, bindings/c/bench; the Rust Producer::next_entry zeroes because its
 * callers may set single fields.) An SQE left with stale fields is refused
 * or run as written by the engine, never undefined behaviour.
 */
static inline struct rf_sqe *rf_get_sqe(struct rf_ring *ring)
{
    uint32_t tail = ring->sq_local_tail;
    /* Free slots by the cached head (Producer::free_cached): a lower bound,
       no shared access. */
    if (tail - ring->sq_cached_head >= ring->sq_entries) {
        /* Acquire: observes the engine's reads of every slot before `head`
           as done; pairs with the Release store in Consumer::release
           (Producer::refresh_head). */
        uint32_t head = __atomic_load_n(ring->sq_shared_head, __ATOMIC_ACQUIRE);
        uint32_t used = tail - head;
        if (used >= ring->sq_entries)
            return NULL; /* full, or corrupt (used > entries), or failed */
        ring->sq_cached_head = head;
    }
    ring->sq_local_tail = tail + 1;
    return &ring->sqes[tail & ring->sq_mask];
}

/* SQEs taken with rf_get_sqe and not yet published by rf_submit. */
static inline uint32_t rf_sq_pending(const struct rf_ring *ring)
{
    return ring->sq_local_tail - ring->sq_published;
}

static inline void _rf_prep(struct rf_sqe *sqe, uint8_t opcode, uint8_t subop,
                            uint32_t ep, uint32_t len, uint32_t local_mem,
                            const void *local_addr, uint64_t remote_addr, uint32_t rkey)
{
    sqe->opcode = opcode;
    sqe->flags = 0;
    sqe->subop = subop;
    sqe->reserved0 = 0;
    sqe->endpoint = ep;
    sqe->len = len;
    sqe->local_mem = local_mem;
    sqe->local_addr = (uint64_t)(uintptr_t)local_addr;
    sqe->remote_addr = remote_addr;
    sqe->rkey = rkey;
    sqe->reserved1 = 0;
    sqe->operand = 0;
    sqe->operand2 = 0;
    sqe->user_data = 0;
}

/* NOP: completes with res = 0 without touching any endpoint. */
static inline void rf_prep_nop(struct rf_sqe *sqe)
{
    _rf_prep(sqe, RF_OP_NOP, 0, 0, 0, 0, NULL, 0, 0);
}

/* PUT `len` bytes from `src` (registered as `src_mem`) to `remote_addr`
   (remote key id `rkey`) over endpoint `ep`. */
static inline void rf_prep_put(struct rf_sqe *sqe, uint32_t ep, const void *src,
                               uint32_t src_mem, uint64_t remote_addr, uint32_t rkey,
                               uint32_t len)
{
    _rf_prep(sqe, RF_OP_PUT, 0, ep, len, src_mem, src, remote_addr, rkey);
}

/* GET `len` bytes from `remote_addr` into `dst` (registered as `dst_mem`). */
static inline void rf_prep_get(struct rf_sqe *sqe, uint32_t ep, void *dst,
                               uint32_t dst_mem, uint64_t remote_addr, uint32_t rkey,
                               uint32_t len)
{
    _rf_prep(sqe, RF_OP_GET, 0, ep, len, dst_mem, dst, remote_addr, rkey);
}

/* An 8-byte atomic `op` (RF_ATOMIC_*) on `remote_addr` (8-byte aligned).
   `result`/`result_mem`: where the old value goes (NULL/0 for ADD);
   `operand`: the addend, the new value, or CSWAP's compare value;
   `operand2`: CSWAP's swap value. */
static inline void rf_prep_atomic(struct rf_sqe *sqe, uint32_t ep, uint8_t op, void *result,
                                  uint32_t result_mem, uint64_t remote_addr, uint32_t rkey,
                                  uint64_t operand, uint64_t operand2)
{
    _rf_prep(sqe, RF_OP_ATOMIC, op, ep, 8, result_mem, result, remote_addr, rkey);
    sqe->operand = operand;
    sqe->operand2 = operand2;
}

/* A fence on `ep`: `mode` RF_FENCE_ORDER (order only; the engine picks the
   cheapest way to keep it) or RF_FENCE_COMPLETE (later operations wait
   until earlier ones are remotely complete). */
static inline void rf_prep_fence(struct rf_sqe *sqe, uint32_t ep, uint8_t mode)
{
    _rf_prep(sqe, RF_OP_FENCE, mode, ep, 0, 0, NULL, 0, 0);
}

/* A flush: completes when everything submitted on `ep` before it is
   remotely complete. It succeeds only if the peer was alive when it
   completed (even with nothing to flush); a dead peer's: RF_EPEER_UNREACHABLE. */
static inline void rf_prep_flush(struct rf_sqe *sqe, uint32_t ep)
{
    _rf_prep(sqe, RF_OP_FLUSH, RF_FLUSH_ENDPOINT, ep, 0, 0, NULL, 0, 0);
}

/* A worker flush (a quiet): completes when everything submitted on every
   endpoint of the worker before it is remotely complete; work submitted
   after it is not waited for. Its result is 0, or the first error of an
   endpoint that failed meanwhile. */
static inline void rf_prep_flush_worker(struct rf_sqe *sqe)
{
    _rf_prep(sqe, RF_OP_FLUSH, RF_FLUSH_WORKER, 0, 0, 0, NULL, 0, 0);
}

/* A notification of `len` bytes at `payload` (registered as `payload_mem`)
   to the peer, delivered after every earlier operation on `ep`. */
static inline void rf_prep_notify(struct rf_sqe *sqe, uint32_t ep, const void *payload,
                                  uint32_t payload_mem, uint32_t len)
{
    _rf_prep(sqe, RF_OP_NOTIFY, 0, ep, len, payload_mem, payload, 0, 0);
}

/* A close of `ep` (RF_CLOSE_GRACEFUL or RF_CLOSE_FORCE). A graceful close
   of a dead peer's endpoint completes with RF_EPEER_UNREACHABLE; the
   endpoint is closed all the same. */
static inline void rf_prep_close(struct rf_sqe *sqe, uint32_t ep, uint8_t mode)
{
    _rf_prep(sqe, RF_OP_CLOSE, mode, ep, 0, 0, NULL, 0, 0);
}

/* Sets the value the CQE returns. */
static inline void rf_sqe_set_data(struct rf_sqe *sqe, uint64_t user_data)
{
    sqe->user_data = user_data;
}

/* Sets the SQE's flags (RF_SQE_*), replacing any it had. */
static inline void rf_sqe_set_flags(struct rf_sqe *sqe, uint8_t flags)
{
    sqe->flags = flags;
}

/*
 * Publishes every SQE taken since the last submit with one release store
 * (Producer::submit), then wakes the core thread only if it sleeps
 * (Producer::needs_wakeup, QueuePair::submit). Returns how many were
 * published; RF_ERING_CORRUPT if the engine failed the ring (RF_SQ_FAILED:
 * it takes none of them, see "A failed ring" above), also when nothing was
 * left to publish; or a negative status if the wake-up failed.
 */
static inline int rf_submit(struct rf_ring *ring)
{
    uint32_t tail = ring->sq_local_tail;
    uint32_t n = tail - ring->sq_published;
    if (n == 0) {
        /* Relaxed: only a report, off the publishing path; nothing is read
           on the strength of it. */
        if (__atomic_load_n(ring->sq_shared_flags, __ATOMIC_RELAXED) & RF_SQ_FAILED)
            return RF_ERING_CORRUPT;
        return 0;
    }
    /* Release: publishes the SQEs in [published, tail); pairs with the
       Acquire load of the tail in Consumer::refresh_tail. */
    __atomic_store_n(ring->sq_tail, tail, __ATOMIC_RELEASE);
    ring->sq_published = tail;
    /* SeqCst fence: orders the tail store above before the flag load below;
       pairs with the fence in Consumer::prepare_wait, where the engine
       stores NEED_WAKEUP and then loads the tail. That is the
       store-buffering (Dekker) pattern: with acquire/release alone both
       loads may miss the other side's store, and the engine would sleep
       on a non-empty SQ. With a SeqCst fence on both sides, whichever
       fence comes second sees the other side's store (the fence io_uring's
       SQPOLL mode needs around IORING_SQ_NEED_WAKEUP; see
       Producer::needs_wakeup). */
    __atomic_thread_fence(__ATOMIC_SEQ_CST);
    /* Relaxed: the fence provides the ordering. The same load tells a
       failed ring (RF_SQ_FAILED, set by Consumer::fail): no added cost. */
    uint32_t flags = __atomic_load_n(ring->sq_shared_flags, __ATOMIC_RELAXED);
    if (flags & RF_SQ_FAILED)
        return RF_ERING_CORRUPT;
    if (flags & RF_SQ_NEED_WAKEUP) {
        int rc = rf_ring_wake(ring);
        if (rc < 0)
            return rc;
    }
    return (int)n;
}

/* The 8-byte word at `addr` (8-byte aligned), read with one atomic load
   (acquire): for a word in registered memory that a peer writes with an
   aligned 8-byte PUT or an atomic, which lands as one store on the shm
   driver, so the load sees the old or the new value whole. */
static inline uint64_t rf_load_u64(const void *addr)
{
    return __atomic_load_n((const uint64_t *)addr, __ATOMIC_ACQUIRE);
}

/* Writes the 8-byte word at `addr` (8-byte aligned) with one atomic store
   (release): for a word a peer polls or GETs (a sequence number, a flag
   after a payload). The counterpart of RegisteredBuf::store_u64. */
static inline void rf_store_u64(void *addr, uint64_t value)
{
    __atomic_store_n((uint64_t *)addr, value, __ATOMIC_RELEASE);
}

/* Prepares a CLOSE of endpoint `ep` (RF_CLOSE_GRACEFUL or RF_CLOSE_FORCE)
   and SUBMITS: like rf_submit, it publishes every SQE prepared before it
   too. Its CQE carries `user_data`. To close without submitting, use
   rf_get_sqe + rf_prep_close and rf_submit when ready, as for any SQE.
   Returns 0, RF_ENO_RESOURCE if the SQ is full (RF_ERING_CORRUPT if it
   looked full because the ring failed), or rf_submit's error. */
static inline int rf_submit_close(struct rf_ring *ring, uint32_t ep, uint8_t mode,
                                  uint64_t user_data)
{
    struct rf_sqe *sqe = rf_get_sqe(ring);
    if (sqe == NULL) {
        /* Relaxed: a hint on the slow path (as in rf_submit). */
        if (__atomic_load_n(ring->sq_shared_flags, __ATOMIC_RELAXED) & RF_SQ_FAILED)
            return RF_ERING_CORRUPT;
        return RF_ENO_RESOURCE;
    }
    rf_prep_close(sqe, ep, mode);
    rf_sqe_set_data(sqe, user_data);
    int rc = rf_submit(ring);
    return rc < 0 ? rc : 0;
}

/* ------------------------------------------------------------------ CQ */

/* CQEs ready: at least `want`, or as many as there are
   (Consumer::available), or RF_ERING_CORRUPT (corrupt indices, or the CQ is
   empty and the ring failed). */
static inline int _rf_cq_available(struct rf_ring *ring, uint32_t want)
{
    uint32_t head = ring->cq_local_head;
    uint32_t ready = ring->cq_cached_tail - head;
    if (ready >= want)
        return (int)ready;
    /* Acquire: makes the CQEs in [head, tail) visible; pairs with the
       Release store in Producer::submit (Consumer::refresh_tail). */
    uint32_t tail = __atomic_load_n(ring->cq_shared_tail, __ATOMIC_ACQUIRE);
    ready = tail - head;
    /* Empty: did the engine fail the ring? Acquire: pairs with the Release
       store in Producer::fail; then the tail again, which then shows every
       CQE published before the flag (Consumer::refresh_tail). */
    if (ready == 0
        && (__atomic_load_n(ring->cq_shared_flags, __ATOMIC_ACQUIRE) & RF_CQ_FAILED)) {
        tail = __atomic_load_n(ring->cq_shared_tail, __ATOMIC_ACQUIRE);
        ready = tail - head;
        if (ready == 0)
            return RF_ERING_CORRUPT;
    }
    if (ready > ring->cq_entries)
        return RF_ERING_CORRUPT;
    ring->cq_cached_tail = tail;
    return (int)ready;
}

/*
 * The oldest CQE, left in the ring (Consumer::peek): 0 with `*cqe` pointing
 * into the CQ, RF_EAGAIN (-EAGAIN) if the CQ is empty (try again later), or
 * RF_ERING_CORRUPT (corrupt indices, or the CQ is empty and the ring
 * failed). Read it, then free its slot with rf_cqe_seen.
 */
static inline int rf_peek_cqe(struct rf_ring *ring, struct rf_cqe **cqe)
{
    int ready = _rf_cq_available(ring, 1);
    if (ready <= 0) {
        *cqe = NULL;
        return ready < 0 ? ready : RF_EAGAIN;
    }
    *cqe = &ring->cqes[ring->cq_local_head & ring->cq_mask];
    return 0;
}

/*
 * Up to `count` CQEs, oldest first, as pointers into the CQ
 * (Consumer::pop_batch without the copy); returns how many, or
 * RF_ERING_CORRUPT. Free them with rf_cq_advance(ring, n).
 */
static inline int rf_peek_batch_cqe(struct rf_ring *ring, struct rf_cqe **cqes,
                                    unsigned count)
{
    int ready = _rf_cq_available(ring, count);
    if (ready < 0)
        return ready;
    unsigned n = (unsigned)ready < count ? (unsigned)ready : count;
    uint32_t head = ring->cq_local_head;
    for (unsigned i = 0; i < n; i++)
        cqes[i] = &ring->cqes[(head + i) & ring->cq_mask];
    return (int)n;
}

/* Frees the slots of the `n` oldest CQEs with one release store
   (Consumer::release). `n` must not exceed what rf_peek_* returned. */
static inline void rf_cq_advance(struct rf_ring *ring, unsigned n)
{
    uint32_t head = ring->cq_local_head + n;
    ring->cq_local_head = head;
    /* Release: this thread's reads of the CQEs before `head` are done;
       pairs with the engine's Acquire load of the head in
       Producer::refresh_head, before it reuses the slots. */
    __atomic_store_n(ring->cq_head, head, __ATOMIC_RELEASE);
}

/* Frees the slot of the CQE that rf_peek_cqe returned. */
static inline void rf_cqe_seen(struct rf_ring *ring, struct rf_cqe *cqe)
{
    (void)cqe;
    rf_cq_advance(ring, 1);
}

/* Whether the engine holds completions that did not fit the CQ (it takes
   no SQEs from this ring until they are reaped). May change at any time. */
static inline int rf_cq_overflowed(const struct rf_ring *ring)
{
    /* Acquire: pairs with the Release in Producer::set_overflow. */
    return (__atomic_load_n(ring->cq_shared_flags, __ATOMIC_ACQUIRE) & RF_CQ_OVERFLOW) != 0;
}

/* The notification buffer id of a CQE with RF_CQE_NOTIFICATION. */
static inline uint16_t rf_cqe_buffer_id(const struct rf_cqe *cqe)
{
    return (uint16_t)(cqe->flags >> RF_CQE_BUFFER_SHIFT);
}

#endif /* RINGFENCE_INLINE_H */
