/*
 * ringfence.h: the C API of ringfence (libringfence).
 *
 * Functions return 0 (or a count) on success and a negative RF_E* status on
 * failure (rf_strerror describes it): each function's comment lists the
 * statuses it returns (a test checks the lists against the code), and any
 * function returns RF_EIO if the library hit an internal error (a bug). Objects are generation-checked
 * handles: a destroyed object's handle is RF_ESTALE_HANDLE, never a crash.
 *
 * The data path is inline (at the end of this file): rf_get_sqe, rf_prep_*,
 * rf_submit, rf_peek_cqe, rf_peek_batch_cqe, rf_cqe_seen, rf_cq_advance
 * write SQEs into and read CQEs out of the ring memory directly.
 *
 * Progress. Nothing moves unless the worker progresses: rf_progress on any
 * thread, rf_wait_cqes (which progresses when no core thread runs), or the
 * core thread (config.core_thread), which then does it all. The initiator
 * always progresses. The target: over shm and loopback, never for PUT,
 * GET and atomics (the initiator's engine accesses the window itself),
 * only to receive notifications; over tcp, always (the target executes
 * every operation and acknowledges it).
 *
 * fork(): a child may not use its parent's workers. Every handle the
 * parent created answers RF_ESTALE_HANDLE in the child, destroy included
 * (the child's copy shares the parent's rings and connections and is left
 * alone); the child may create workers of its own. Do not touch the
 * parent's rings with the inline helpers in the child, and fork while no
 * other thread is inside the library.
 *
 * C11 and C++17 (GCC or Clang).
 */

#ifndef RINGFENCE_H
#define RINGFENCE_H

/* Generated from bindings/c/src by cbindgen (bindings/c/build.rs), with
   bindings/c/src/inline.h appended: edit those, then regenerate with
   RINGFENCE_BLESS=1 cargo test -p ringfence-c. */

#include <stddef.h>
#include <stdint.h>
/* `struct rf_sqe` is aligned like the Rust `Sqe`: one 64-byte line. */
#define RF_ALIGNED(n) __attribute__((aligned(n)))

/**
 * The library version, `major << 16 | minor << 8 | patch`, as returned by
 * `rf_version`.
 */
#define RF_VERSION 256

/**
 * The most lanes an endpoint has (`RINGFENCE_LANES`, `config.lanes`, the
 * connect calls): one limit, checked in one place.
 */
#define RF_MAX_LANES 64

/**
 * Opcode: does nothing; completes with `res = 0`.
 */
#define RF_OP_NOP 0

/**
 * Opcode: writes `len` bytes from local to remote memory.
 */
#define RF_OP_PUT 1

/**
 * Opcode: reads `len` bytes from remote into local memory.
 */
#define RF_OP_GET 2

/**
 * Opcode: an 8-byte atomic on remote memory (`subop`: `RF_ATOMIC_*`).
 */
#define RF_OP_ATOMIC 3

/**
 * Opcode: orders later operations after earlier ones (`subop`:
 * `RF_FENCE_*`).
 */
#define RF_OP_FENCE 4

/**
 * Opcode: completes when every earlier operation on the endpoint is
 * remotely complete.
 */
#define RF_OP_FLUSH 5

/**
 * Opcode: a small payload to the peer, after every earlier operation.
 */
#define RF_OP_NOTIFY 6

/**
 * Opcode: closes the endpoint (`subop`: `RF_CLOSE_*`).
 */
#define RF_OP_CLOSE 7

/**
 * SQE flag: post no CQE if the operation succeeds.
 */
#define RF_SQE_SKIP_SUCCESS 1

/**
 * CQE flag: an incoming notification (`res` is the payload length; read
 * it with `rf_notification_read`).
 */
#define RF_CQE_NOTIFICATION 1

/**
 * Bits 16..32 of a notification CQE's flags: its buffer id.
 */
#define RF_CQE_BUFFER_SHIFT 16

/**
 * Atomic: `*remote += operand`.
 */
#define RF_ATOMIC_ADD 0

/**
 * Atomic: fetch-and-add.
 */
#define RF_ATOMIC_FADD 1

/**
 * Atomic: swap.
 */
#define RF_ATOMIC_SWAP 2

/**
 * Atomic: compare-and-swap (`operand` compare, `operand2` swap).
 */
#define RF_ATOMIC_CSWAP 3

/**
 * Fence mode "order": later operations take effect at the target after
 * earlier ones; the engine picks the cheapest way (nothing when nothing
 * is outstanding, a transport fence on one ordered lane, else a flush).
 */
#define RF_FENCE_ORDER 0

/**
 * Fence mode "complete": nothing after starts before everything before
 * is remotely complete (a flush whenever anything is outstanding).
 */
#define RF_FENCE_COMPLETE 1

/**
 * Deprecated: the former name of `RF_FENCE_ORDER`.
 */
#define RF_FENCE_WEAK RF_FENCE_ORDER

/**
 * Deprecated: the former name of `RF_FENCE_COMPLETE`.
 */
#define RF_FENCE_STRONG RF_FENCE_COMPLETE

/**
 * Flush scope: everything submitted on the SQE's endpoint before it.
 */
#define RF_FLUSH_ENDPOINT 0

/**
 * Flush scope: everything submitted on every endpoint of the worker
 * before it (a quiet); the SQE's endpoint must be 0.
 */
#define RF_FLUSH_WORKER 1

/**
 * Close after everything submitted before is remotely complete.
 */
#define RF_CLOSE_GRACEFUL 0

/**
 * Close at once; queued operations complete with `RF_ECANCELED`.
 */
#define RF_CLOSE_FORCE 1

/**
 * In `*sq_shared_flags`: the engine sleeps; `rf_submit` wakes it.
 */
#define RF_SQ_NEED_WAKEUP 1

/**
 * In `*cq_wait_flags`: this thread waits on the CQ eventfd.
 */
#define RF_CQ_NEED_WAKEUP 1

/**
 * In `*cq_shared_flags`: the engine holds completions that did not fit;
 * it takes no SQEs from this ring until they are reaped.
 */
#define RF_CQ_OVERFLOW 1

/**
 * In `*sq_shared_flags`: the engine failed this ring (it found the ring
 * memory corrupt) and takes no more SQEs; `rf_submit` returns
 * `RF_ERING_CORRUPT`. Set once, never cleared.
 */
#define RF_SQ_FAILED 2

/**
 * In `*cq_shared_flags`: the engine failed this ring and posts no more
 * CQEs; `rf_peek_cqe` returns `RF_ERING_CORRUPT` once the CQ is empty.
 * Set once, never cleared.
 */
#define RF_CQ_FAILED 2

/**
 * `rf_ep_state`: the driver's handshake goes on; SQEs queue in order and
 * start when it is up.
 */
#define RF_EP_CONNECTING 0

/**
 * `rf_ep_state`: up; operations start.
 */
#define RF_EP_CONNECTED 1

/**
 * `rf_ep_state`: a graceful close is queued; new SQEs fail.
 */
#define RF_EP_CLOSING 2

/**
 * `rf_ep_state`: failed; `*error` holds the sticky first error, which
 * every operation on it completes with.
 */
#define RF_EP_FAILED 3

/**
 * `rf_ep_state`: closed; every SQE fails with `RF_EENDPOINT_CLOSED`.
 */
#define RF_EP_CLOSED 4

/**
 * The library's own status codes are this value and below, outside the
 * errno range.
 */
#define RF_ELIBRARY_BASE -4096

/**
 * The operation was canceled before it ran.
 */
#define RF_ECANCELED -125

/**
 * The SQE's opcode is unknown.
 */
#define RF_EINVALID_OPCODE -4097

/**
 * An SQE flag bit this version does not define. (A non-zero reserved or
 * unused SQE field is `RF_EINVALID_ARGUMENT`.)
 */
#define RF_EINVALID_FLAGS -4098

/**
 * No such endpoint.
 */
#define RF_EINVALID_ENDPOINT -4099

/**
 * No such local memory handle (never registered, or deregistered).
 */
#define RF_EINVALID_MEM_HANDLE -4100

/**
 * No such remote key id.
 */
#define RF_EINVALID_RKEY -4101

/**
 * The range lies outside its registered region.
 */
#define RF_EOUT_OF_BOUNDS -14

/**
 * An atomic's address is not 8-byte aligned.
 */
#define RF_EMISALIGNED -4102

/**
 * A zero length where data is required, or a length over the limit.
 */
#define RF_EINVALID_LENGTH -4103

/**
 * The target refused the access.
 */
#define RF_EACCESS_DENIED -13

/**
 * The endpoint failed earlier.
 */
#define RF_EENDPOINT_FAILED -4104

/**
 * The endpoint was closed.
 */
#define RF_EENDPOINT_CLOSED -107

/**
 * Out of resources (a full SQ, the request pool): try again later.
 */
#define RF_ENO_RESOURCE -105

/**
 * The transport reported an error.
 */
#define RF_ETRANSPORT -70

/**
 * Timed out.
 */
#define RF_ETIMEOUT -62

/**
 * Not supported by the driver or this build.
 */
#define RF_EUNSUPPORTED -95

/**
 * Ring indices are inconsistent (corrupt ring memory).
 */
#define RF_ERING_CORRUPT -4105

/**
 * The peer is gone.
 */
#define RF_EPEER_UNREACHABLE -113

/**
 * An invalid argument: a NULL pointer, a bad value, a handle of the
 * wrong kind, a malformed or damaged address or key blob, a non-zero
 * reserved field, or an SQE field its opcode does not use that is not
 * zero.
 */
#define RF_EINVALID_ARGUMENT -22

/**
 * The handle's object was destroyed.
 */
#define RF_ESTALE_HANDLE -116

/**
 * Out of memory.
 */
#define RF_ENO_MEMORY -12

/**
 * The object is in use.
 */
#define RF_EBUSY -16

/**
 * The output buffer is too small, or a payload did not fit.
 */
#define RF_ETRUNCATED -90

/**
 * Unknown atomic operation, fence mode or close mode.
 */
#define RF_EINVALID_SUBOP -4106

/**
 * An operating system error, or an internal error of the library.
 */
#define RF_EIO -5

/**
 * Nothing ready yet (an empty CQ): try again later.
 */
#define RF_EAGAIN -11

/**
 * The longest address or key blob a function reads (real ones are tens of
 * bytes): a larger length is `RF_EINVALID_LENGTH`, before anything is read.
 */
#define RF_MAX_BLOB (1 << 16)

/**
 * A worker: drivers, endpoints, memory, rings and the progress loop.
 * A generation-checked handle, never a pointer; 0 is never valid.
 */
typedef uint64_t rf_worker_t;

/**
 * A submission queue entry: one operation, exactly 64 bytes. The same
 * layout as the Rust `ringfence_ring::Sqe` (asserted on both sides). Fill
 * it with the `rf_prep_*` helpers, which write all 64 bytes.
 *
 * Every field the opcode does not use must be zero, so that a later
 * version can give it a meaning: the SQE otherwise completes with
 * `RF_EINVALID_ARGUMENT` and does nothing. The reserved fields are used by
 * no opcode. A flag bit this version does not define is
 * `RF_EINVALID_FLAGS`; a `subop` where the opcode takes none (PUT, GET,
 * NOTIFY, NOP) or an unknown one is `RF_EINVALID_SUBOP`. Besides `opcode`,
 * `flags` and `user_data`: PUT and GET use `endpoint`, `len`, `local_*`,
 * `rkey`, `remote_addr`; ATOMIC uses `subop`, `endpoint`, `len`, `rkey`,
 * `remote_addr`, `operand`, `local_*` unless ADD, `operand2` for CSWAP
 * only; FENCE and CLOSE `subop` and `endpoint`; FLUSH `subop`, and
 * `endpoint` for `RF_FLUSH_ENDPOINT` (a worker flush's non-zero endpoint
 * is `RF_EINVALID_ENDPOINT`); NOTIFY `endpoint`, `len`, `local_*` and
 * `operand` (the tag); NOP nothing.
 */
struct RF_ALIGNED(64) rf_sqe {
  /**
   * `RF_OP_*`.
   */
  uint8_t opcode;
  /**
   * `RF_SQE_*` flags.
   */
  uint8_t flags;
  /**
   * `RF_ATOMIC_*` of an ATOMIC, `RF_FENCE_*` of a FENCE, `RF_CLOSE_*`
   * of a CLOSE, `RF_FLUSH_*` of a FLUSH; zero otherwise (else
   * `RF_EINVALID_SUBOP`).
   */
  uint8_t subop;
  /**
   * Reserved; zero (else `RF_EINVALID_ARGUMENT`).
   */
  uint8_t reserved0;
  /**
   * The endpoint id (from `rf_ep_connect`); zero for a NOP and a worker
   * flush.
   */
  uint32_t endpoint;
  /**
   * Bytes to move (PUT, GET, NOTIFY); 8 for ATOMIC; zero otherwise.
   */
  uint32_t len;
  /**
   * Local memory handle of `local_addr` (from `rf_mem_register` or
   * `rf_mem_alloc`); zero where that is.
   */
  uint32_t local_mem;
  /**
   * Local address: PUT source, GET destination, the fetched value of an
   * atomic other than ADD, the NOTIFY payload; zero otherwise.
   */
  uint64_t local_addr;
  /**
   * Remote address of PUT, GET and ATOMIC; zero otherwise.
   */
  uint64_t remote_addr;
  /**
   * Remote key id of `remote_addr` (from `rf_rkey_unpack`); zero where
   * that is.
   */
  uint32_t rkey;
  /**
   * Reserved; zero (else `RF_EINVALID_ARGUMENT`).
   */
  uint32_t reserved1;
  /**
   * ATOMIC operand: the addend, the new value of SWAP, the compare value
   * of CSWAP. NOTIFY: the tag (the `user_data` of the target's CQE).
   * Zero otherwise.
   */
  uint64_t operand;
  /**
   * The swap value of CSWAP; zero otherwise.
   */
  uint64_t operand2;
  /**
   * Returned untouched in the CQE.
   */
  uint64_t user_data;
};

/**
 * A completion queue entry: exactly 16 bytes, the same layout as the Rust
 * `ringfence_ring::Cqe`.
 */
struct rf_cqe {
  /**
   * The `user_data` of the SQE this completes (or of the notification
   * buffer, for an incoming notification).
   */
  uint64_t user_data;
  /**
   * Zero or more: success (bytes moved where that applies). Negative: an
   * `RF_E*` status.
   */
  int32_t res;
  /**
   * `RF_CQE_*` flags; bits 16..32 hold a notification's buffer id.
   */
  uint32_t flags;
};

/**
 * A ring (one SQ and one CQ, for one thread). A generation-checked
 * handle, never a pointer; 0 is never valid.
 */
typedef uint64_t rf_ring_t;

/**
 * One thread's ring: its SQ and CQ as pointers into the ring memory, plus
 * the thread's own indices. Filled by `rf_ring_create`; used by the inline
 * helpers (`rf_get_sqe`, `rf_submit`, `rf_peek_cqe`, ...), which follow the
 * Rust `Producer`/`Consumer` protocol exactly. One thread at a time uses a
 * ring. `shared_*` words are written by the engine; `cached_*` are this
 * thread's copies of them; `local_*` are this thread's own indices.
 */
struct rf_ring {
  /**
   * SQ tail in ring memory: written here (release store, `rf_submit`),
   * read by the engine (acquire).
   */
  uint32_t *sq_tail;
  /**
   * SQ head in ring memory: written by the engine (release), read here
   * (acquire) when `sq_cached_head` says the SQ is full.
   */
  uint32_t *sq_shared_head;
  /**
   * The engine's SQ flags (`RF_SQ_NEED_WAKEUP`, `RF_SQ_FAILED`), read
   * by `rf_submit` after a sequentially consistent fence.
   */
  uint32_t *sq_shared_flags;
  /**
   * The SQ's `sq_entries` slots.
   */
  struct rf_sqe *sqes;
  /**
   * `sq_entries - 1`.
   */
  uint32_t sq_mask;
  /**
   * SQ slots; a power of two.
   */
  uint32_t sq_entries;
  /**
   * The next SQ slot to fill (free-running).
   */
  uint32_t sq_local_tail;
  /**
   * The tail last stored to `sq_tail`.
   */
  uint32_t sq_published;
  /**
   * The engine's SQ head as last loaded; may be stale (behind).
   */
  uint32_t sq_cached_head;
  /**
   * Reserved.
   */
  uint32_t sq_reserved;
  /**
   * CQ head in ring memory: written here (release store,
   * `rf_cq_advance`), read by the engine (acquire).
   */
  uint32_t *cq_head;
  /**
   * CQ tail in ring memory: written by the engine (release), read here
   * (acquire) when `cq_cached_tail` says the CQ is empty.
   */
  uint32_t *cq_shared_tail;
  /**
   * The engine's CQ flags (`RF_CQ_OVERFLOW`, `RF_CQ_FAILED`), acquire.
   */
  uint32_t *cq_shared_flags;
  /**
   * This thread's CQ flags (`RF_CQ_NEED_WAKEUP`), set by
   * `rf_ring_cq_arm`.
   */
  uint32_t *cq_wait_flags;
  /**
   * The CQ's `cq_entries` slots.
   */
  struct rf_cqe *cqes;
  /**
   * `cq_entries - 1`.
   */
  uint32_t cq_mask;
  /**
   * CQ slots; a power of two.
   */
  uint32_t cq_entries;
  /**
   * The next CQ slot to read (free-running).
   */
  uint32_t cq_local_head;
  /**
   * The engine's CQ tail as last loaded; may be stale (behind).
   */
  uint32_t cq_cached_tail;
  /**
   * The ring's handle, for the library calls that take the ring.
   */
  rf_ring_t handle;
  /**
   * Reserved.
   */
  uint64_t reserved[4];
};

/**
 * How `rf_worker_create` builds a worker. Start from
 * `rf_worker_config_init`; a zero numeric field means the default (or the
 * `RINGFENCE_*` environment variable, unless `ignore_env` is set).
 */
struct rf_worker_config {
  /**
   * Comma-separated driver names in priority order (`"shm"`, `"tcp"`,
   * `"loopback"`), NUL-terminated; NULL for the default (`"shm"` when the
   * library has it, else `"loopback"`). A name given twice counts once.
   * `"tcp"` listens on `RINGFENCE_TCP_ADDR` (default 127.0.0.1, any
   * port), or on 127.0.0.1 with `ignore_env`; over tcp the target must
   * make progress (its core thread, or `rf_progress`).
   */
  const char *drivers;
  /**
   * SQ entries of each ring (power of two, at most 65536).
   */
  uint32_t sq_entries;
  /**
   * CQ entries of each ring (power of two, at most 65536).
   */
  uint32_t cq_entries;
  /**
   * Requests in flight per ring.
   */
  uint32_t requests;
  /**
   * Lanes per endpoint: 1 to `RF_MAX_LANES` (0: the default), capped
   * by the driver.
   */
  uint32_t lanes;
  /**
   * Notification buffers (at most 65536; together with `notify_size`
   * counted against the memory limit, see `rf_mem_alloc`).
   */
  uint32_t notify_buffers;
  /**
   * Bytes per notification buffer.
   */
  uint32_t notify_size;
  /**
   * Non-zero: start the core thread (busy-polling progress) at creation.
   */
  uint32_t core_thread;
  /**
   * The core thread's CPU; negative: `RINGFENCE_CORE_CPU`, else a CPU
   * other than the calling thread's (unpinned if it may run on one only).
   */
  int32_t core_cpu;
  /**
   * Non-zero: ignore `RINGFENCE_*` environment variables.
   */
  uint32_t ignore_env;
  /**
   * Reserved; zero.
   */
  uint32_t reserved[7];
};

/**
 * A snapshot of an endpoint's fence engine, from `rf_ep_fence_state`
 * (docs/fence.md §3 names the epochs and masks). Consistent when taken;
 * progress may change it right after.
 */
struct rf_fence_state {
  /**
   * W: the submission epoch, bumped by every FENCE and before every
   * NOTIFY.
   */
  uint64_t submit_epoch;
  /**
   * C: the admitted epoch; requests of epochs up to C may start.
   */
  uint64_t admitted_epoch;
  /**
   * D: lanes written since the last flush of them started.
   */
  uint64_t dirty_lanes;
  /**
   * Lanes whose earlier work FLUSHes, CLOSEs or worker flushes in
   * flight cover (clean once they complete).
   */
  uint64_t covered_lanes;
  /**
   * Lanes of the strong fence flush in flight; 0 when none is.
   */
  uint64_t flushing_lanes;
  /**
   * The epoch C moves to when that flush completes; 0 when none is.
   */
  uint64_t fence_target;
  /**
   * The epoch a weak fence admitted on `weak_lane` only; 0 when none.
   */
  uint64_t weak_epoch;
  /**
   * FENCE SQEs taken on the endpoint.
   */
  uint64_t fences;
  /**
   * Boundaries crossed with a transport fence flag on one ordered lane.
   */
  uint64_t weak_fences;
  /**
   * Driver flushes started by strong fences.
   */
  uint64_t fence_flushes;
  /**
   * Driver flushes started by the implicit fence before a NOTIFY.
   */
  uint64_t notify_flushes;
  /**
   * Driver flushes started by FLUSH SQEs and graceful CLOSEs.
   */
  uint64_t user_flushes;
  /**
   * Driver flushes started by worker flushes (`RF_FLUSH_WORKER`).
   */
  uint64_t worker_flushes;
  /**
   * Requests waiting in the endpoint's FIFO behind a boundary or the
   * handshake.
   */
  uint32_t deferred;
  /**
   * Requests and flushes at the driver, not yet completed.
   */
  uint32_t in_flight;
  /**
   * The lane of `weak_epoch`; 255 when none.
   */
  uint8_t weak_lane;
  /**
   * Zero.
   */
  uint8_t reserved[7];
};

#ifdef __cplusplus
extern "C" {
#endif // __cplusplus

/**
 * Registers `[addr, addr + len)` for local use in SQEs (`local_mem`) and
 * for remote access by peers given its key (`rf_rkey_pack`); stores the
 * memory handle in `*mem`.
 *
 * Returns 0; `RF_EINVALID_ARGUMENT` for NULL `addr` or `mem`;
 * `RF_EINVALID_LENGTH` for a zero `len`, one above `PTRDIFF_MAX`, or a
 * range that wraps the address space; `RF_ENO_RESOURCE` when 65,536
 * registrations exist; `RF_ESTALE_HANDLE`.
 *
 * # Safety
 * - The range is memory of this process that stays valid and writable
 *   until `rf_mem_deregister` or `rf_worker_destroy` (the library cannot
 *   check this: registering memory that is not yours is undefined).
 * - Peers and the engine may write it at any time while it is registered.
 * - `mem` is NULL or points to a writable `uint32_t`.
 */
int rf_mem_register(rf_worker_t worker, void *addr, size_t len, uint32_t *mem);

/**
 * Allocates `len` zeroed, 64-byte aligned bytes and registers them (from
 * the shm driver's sealed memfd when the worker has it, so that peers map
 * it directly); stores the address in `*addr` and the memory handle in
 * `*mem`. Free it with `rf_mem_free` (or `rf_mem_deregister`); it is also
 * freed by `rf_worker_destroy`.
 *
 * The memory limit: `len` rounded up to whole pages, plus the
 * process's live ringfence allocations (memory from `rf_mem_alloc`,
 * workers' notification buffers), must fit in the smallest of physical
 * memory plus swap, the cgroup's memory limit (v2 `memory.max` plus
 * `memory.swap.max`, v1 `memory.limit_in_bytes`, of the process's cgroup
 * and its ancestors) and a finite `RLIMIT_AS` or `RLIMIT_DATA`, as read
 * when the worker was created; beyond it the call fails at once. Memory
 * from the shm driver is allocated in full here (it is there, or the call
 * fails); heap memory is zeroed by the kernel page by page as first
 * touched.
 *
 * Returns 0; `RF_EINVALID_ARGUMENT` for NULL `addr` or `mem`;
 * `RF_EINVALID_LENGTH` for a zero `len` or one above `PTRDIFF_MAX`;
 * `RF_ENO_MEMORY` beyond the memory limit or if it cannot be had;
 * `RF_ESTALE_HANDLE`.
 *
 * # Safety
 * - `addr` is NULL or points to a writable `void *`; `mem` is NULL or
 *   points to a writable `uint32_t`.
 */
int rf_mem_alloc(rf_worker_t worker, size_t len, void **addr, uint32_t *mem);

/**
 * Withdraws a registration (`rf_mem_register` or `rf_mem_alloc`; memory
 * from `rf_mem_alloc` is freed once no driver can touch it). Fails
 * cleanly, changing nothing, while operations that use it are in flight.
 * For memory from `rf_mem_register`, 0 means that no driver can touch it
 * any more and it may be freed; while a driver still holds it (a peer's
 * PUT still arriving), the handle is withdrawn but this returns
 * `RF_EBUSY`: keep the memory, progress, and call again with the same
 * handle (for ever `RF_EBUSY` if a driver can never release it: then the
 * memory must never be freed).
 *
 * Returns 0; `RF_EINVALID_MEM_HANDLE` for a handle that is not a live
 * registration of this worker (a second deregistration included);
 * `RF_EBUSY` while in use or held; `RF_ESTALE_HANDLE`.
 */
int rf_mem_deregister(rf_worker_t worker, uint32_t mem);

/**
 * Deregisters and frees memory from `rf_mem_alloc`.
 *
 * Returns 0; `RF_EINVALID_MEM_HANDLE` for a handle that is not a live
 * allocation of this worker (a double free, or memory from
 * `rf_mem_register`); `RF_EBUSY` while in use; `RF_ESTALE_HANDLE`.
 */
int rf_mem_free(rf_worker_t worker, uint32_t mem);

/**
 * Copies the remote key of registration `mem` (a blob for a peer's
 * `rf_rkey_unpack`: exact bounds and a random secret) into `buf`, and its
 * length into `*len`; `buf` NULL with `cap` 0 is a size query.
 *
 * Returns 0; `RF_ETRUNCATED` if `cap` is too small (`*len` holds the size
 * needed); `RF_EINVALID_MEM_HANDLE`; `RF_EINVALID_ARGUMENT` for a NULL
 * `len`, or a NULL `buf` with a non-zero `cap`; `RF_ESTALE_HANDLE`.
 *
 * # Safety
 * - `buf` is NULL or points to `cap` writable bytes.
 * - `len` is NULL or points to a writable `size_t`.
 */
int rf_rkey_pack(rf_worker_t worker, uint32_t mem, void *buf, size_t cap, size_t *len);

/**
 * The remote region that remote key `rkey` (from `rf_rkey_unpack` on
 * endpoint `ep`) reaches: stores its base in `*base`, the target's own
 * virtual address of the window, which is the address PUTs and GETs
 * name, and its length in bytes in `*len`.
 *
 * Returns 0; `RF_EINVALID_RKEY` if `rkey` was not unpacked for `ep`;
 * `RF_EINVALID_ENDPOINT`; `RF_EINVALID_ARGUMENT` for NULL pointers;
 * `RF_ESTALE_HANDLE`.
 *
 * # Safety
 * - `base` and `len` are NULL or point to writable `uint64_t`s.
 */
int rf_rkey_bounds(rf_worker_t worker, uint32_t ep, uint32_t rkey, uint64_t *base, uint64_t *len);

/**
 * Turns a peer's key blob (the `len` bytes at `blob`, from its
 * `rf_rkey_pack`) into a remote key id for SQEs on endpoint `ep`
 * (`rkey`); stores it in `*rkey`.
 *
 * The whole blob is checked first, field by field and against its
 * integrity check (a CRC-32C), so that a damaged one is refused before
 * anything is sent to the target.
 *
 * Returns 0; `RF_EINVALID_ARGUMENT` for NULL pointers, or a blob that is
 * malformed or damaged (a flipped bit, cut short, bytes after its end),
 * its driver's part included; `RF_EINVALID_RKEY` if the endpoint's
 * driver refuses the key (it belongs to another peer, or names no region
 * the target exports with those bounds); `RF_EINVALID_LENGTH` for a zero
 * `len` or one over `RF_MAX_BLOB`; `RF_EINVALID_ENDPOINT`; the target's
 * refusal (`RF_EACCESS_DENIED` for a wrong secret); `RF_ESTALE_HANDLE`.
 *
 * # Safety
 * - `blob` is NULL or points to `len` readable bytes.
 * - `rkey` is NULL or points to a writable `uint32_t`.
 */
int rf_rkey_unpack(rf_worker_t worker, uint32_t ep, const void *blob, size_t len, uint32_t *rkey);

/**
 * Releases remote key `rkey` (from `rf_rkey_unpack`): each driver frees
 * what unpacking it made (a table entry, a device mapping), and the id is
 * stale from now on (SQEs naming it fail with `RF_EINVALID_RKEY`). Keys
 * still unpacked when their endpoint closes, or the worker is destroyed,
 * are released then.
 *
 * Returns 0; `RF_EINVALID_RKEY` for an id that is not a live key of this
 * worker (a second release included); `RF_EBUSY`, changing nothing,
 * while the key's endpoint has operations queued or in flight (release
 * it after they completed); `RF_EINVALID_ARGUMENT` for a NULL `worker`;
 * `RF_ESTALE_HANDLE`.
 */
int rf_rkey_release(rf_worker_t worker, uint32_t rkey);

/**
 * Creates a ring (one SQ of `sq_entries` and one CQ of `cq_entries`; 0
 * for the worker's configured sizes) for the calling thread, and fills
 * `*ring` for the inline helpers. The first ring of a worker also receives
 * its incoming notifications.
 *
 * Returns 0; `RF_EINVALID_ARGUMENT` for a NULL `ring` or entry counts that
 * are not powers of two up to 65536; `RF_ENO_RESOURCE` past 4096 rings in
 * the worker's life (destroyed rings count: the engine keeps their
 * memory); `RF_ENO_MEMORY` if the ring memory cannot be allocated;
 * `RF_ESTALE_HANDLE`. `*ring` is written only on success.
 *
 * # Safety
 * - `ring` is NULL or points to a writable `struct rf_ring`.
 */
int rf_ring_create(rf_worker_t worker,
                   uint32_t sq_entries,
                   uint32_t cq_entries,
                   struct rf_ring *ring);

/**
 * Destroys a ring; its pointers in `*ring` become NULL (the handle stays,
 * so a second destroy is `RF_ESTALE_HANDLE`). The engine keeps the ring's
 * memory until the worker is destroyed: SQEs submitted before still run,
 * and their completions land in a CQ that nobody reads. This is also how a
 * failed ring (`RF_ERING_CORRUPT`, see the inline helpers' "A failed
 * ring") is torn down: it always works, the engine reads nothing more from
 * that memory, and it finishes what it had taken from the ring (freeing
 * its request slots) without posting CQEs; `rf_progress` stops reporting
 * the ring.
 *
 * Returns 0; `RF_ESTALE_HANDLE` for a destroyed ring;
 * `RF_EINVALID_ARGUMENT` for NULL or a handle that is not a ring's.
 *
 * # Safety
 * - `ring` is NULL or points to a writable `struct rf_ring`, which no
 *   other thread uses.
 */
int rf_ring_destroy(struct rf_ring *ring);

/**
 * Wakes the worker's core thread after `rf_submit` published SQEs while it
 * slept (`RF_SQ_NEED_WAKEUP`). `rf_submit` calls it; calling it otherwise
 * is harmless.
 *
 * Returns 0; `RF_ESTALE_HANDLE`; `RF_EINVALID_ARGUMENT`.
 *
 * # Safety
 * - `ring` is NULL or points to a readable `struct rf_ring`.
 */
int rf_ring_wake(const struct rf_ring *ring);

/**
 * Runs the PUT or GET `*sqe` at once, on this thread, where that keeps
 * every rule of the ring (see `QueuePair::try_now`): the engine would
 * start it at once anyway, the ring has no SQE the engine has not taken
 * (none taken with `rf_get_sqe` and not yet submitted either), and no
 * other thread is inside the engine. For the lowest latency; declined,
 * push it as usual.
 *
 * Returns 1 when it ran: `*res` is its one completion (bytes, or the
 * negative status its CQE would carry) and no CQE follows; 0 when it
 * declined (nothing done, `*res` untouched); `RF_ERING_CORRUPT` if the
 * engine failed the ring (nothing done, `*res` untouched);
 * `RF_ESTALE_HANDLE`; `RF_EINVALID_ARGUMENT` for NULL or misaligned
 * pointers.
 *
 * # Safety
 * - `ring` is NULL or points to a readable `struct rf_ring`;
 * - `sqe` is NULL or points to a readable `struct rf_sqe`;
 * - `res` is NULL or points to a writable `int32_t`.
 */
int rf_ring_try_now(const struct rf_ring *ring, const struct rf_sqe *sqe, int32_t *res);

/**
 * The CQ's eventfd, to put in epoll (or poll) for `EPOLLIN`. It becomes
 * readable when the engine posts CQEs while the ring is armed
 * (`rf_ring_cq_arm`). It belongs to the ring: do not close it.
 *
 * Returns the descriptor (>= 0); `RF_ESTALE_HANDLE`;
 * `RF_EINVALID_ARGUMENT`.
 *
 * # Safety
 * - `ring` is NULL or points to a readable `struct rf_ring`.
 */
int rf_ring_cq_fd(const struct rf_ring *ring);

/**
 * Waits until at least `nr` CQEs are ready in `ring`'s CQ, or
 * `timeout_ns` nanoseconds pass (negative: no limit), as
 * `io_uring_wait_cqe_nr` with a timeout. Without a core thread it runs the
 * worker's progress on this thread meanwhile; with one it sleeps on the
 * CQ's eventfd. It never waits past the deadline by more than one
 * progress round. CQEs are counted from the head `rf_cq_advance`
 * published: call it from the thread that reaps the ring, after
 * advancing past what it consumed. `nr` = 0 returns the count at once.
 *
 * Returns the count ready (at least `nr`); `RF_ETIMEOUT` if the deadline
 * passed first (what arrived stays to be reaped); `RF_EINVALID_ARGUMENT`
 * if `nr` is more than the CQ holds; `RF_ERING_CORRUPT` if the CQ's
 * indices are corrupt, or fewer than `nr` CQEs are ready and the engine
 * failed the ring (at once, not at the deadline); `RF_EIO` if the eventfd
 * fails; `RF_ESTALE_HANDLE`.
 *
 * # Safety
 * - `ring` is NULL or points to a readable `struct rf_ring`.
 */
int rf_wait_cqes(const struct rf_ring *ring, uint32_t nr, int64_t timeout_ns);

/**
 * Whether the engine failed the ring: it found the ring memory corrupt
 * (see the inline helpers' "A failed ring"). The engine's own record, in
 * process memory: scribbles over the ring's flags do not hide it.
 *
 * Returns 0 while the ring works; `RF_ERING_CORRUPT` once it failed
 * (destroy it); `RF_ESTALE_HANDLE`; `RF_EINVALID_ARGUMENT`.
 *
 * # Safety
 * - `ring` is NULL or points to a readable `struct rf_ring`.
 */
int rf_ring_check(const struct rf_ring *ring);

/**
 * Arms the CQ's eventfd before sleeping in epoll: asks the engine to
 * signal it when it posts CQEs, then looks at the CQ once more (the same
 * protocol as the Rust `Consumer::prepare_wait`). Call it from the thread
 * that reaps the ring, after reaping with `rf_cq_advance`.
 *
 * Returns 1: armed, the CQ is empty, sleep (the core thread must run);
 * 0: CQEs are ready, do not sleep (the ring is left unarmed);
 * `RF_ERING_CORRUPT` if the CQ's indices are inconsistent, or the CQ is
 * empty and the engine failed the ring (nothing will come; the ring is
 * left unarmed); `RF_ESTALE_HANDLE`; `RF_EINVALID_ARGUMENT`.
 *
 * # Safety
 * - `ring` is NULL or points to a readable `struct rf_ring`.
 */
int rf_ring_cq_arm(const struct rf_ring *ring);

/**
 * Disarms the CQ's eventfd after waking (or instead of sleeping) and
 * clears it, so that it is not readable until the next armed post.
 *
 * Returns 1 if the eventfd had been signalled, 0 if not; `RF_EIO` if it
 * cannot be read; `RF_ESTALE_HANDLE`; `RF_EINVALID_ARGUMENT`.
 *
 * # Safety
 * - `ring` is NULL or points to a readable `struct rf_ring`.
 */
int rf_ring_cq_disarm(const struct rf_ring *ring);

/**
 * Copies the payload of an incoming notification CQE
 * (`RF_CQE_NOTIFICATION` in its flags; `res` is the length) into `buf`,
 * stores its length in `*len`, and gives the buffer back to the worker.
 * Every notification CQE must be read once, or its buffer stays taken.
 *
 * Returns 0; `RF_ETRUNCATED` if `cap` is below `cqe->res` (nothing is
 * consumed; `*len` holds the size needed); `RF_EINVALID_ARGUMENT` for
 * NULL pointers or a CQE that is not a notification not yet read;
 * `RF_ESTALE_HANDLE`.
 *
 * # Safety
 * - `ring` is NULL or points to a readable `struct rf_ring`; `cqe` is NULL
 *   or points to a readable `struct rf_cqe`.
 * - `buf` is NULL or points to `cap` writable bytes; `len` is NULL or
 *   points to a writable `size_t`.
 */
int rf_notification_read(const struct rf_ring *ring,
                         const struct rf_cqe *cqe,
                         void *buf,
                         size_t cap,
                         size_t *len);

/**
 * Fills `*config` with the defaults: every number zero (meaning the
 * library's default or the `RINGFENCE_*` variable), NULL drivers (`"shm"`
 * when the library has it, else `"loopback"`), no core thread, `core_cpu`
 * -1, environment variables honoured.
 *
 * Returns 0, or `RF_EINVALID_ARGUMENT` for a NULL or misaligned `config`.
 *
 * # Safety
 * - `config` is NULL or points to a writable `struct rf_worker_config`.
 */
int rf_worker_config_init(struct rf_worker_config *config);

/**
 * Creates a worker from `config` (NULL: the defaults of
 * `rf_worker_config_init`) and stores its handle in `*worker`; starts its
 * core thread if `config->core_thread` is set.
 *
 * Returns 0; `RF_EINVALID_ARGUMENT` for a NULL `worker`, an unknown driver
 * name, a non-zero reserved field or a bad value (entries not a power of
 * two, lanes outside 1 to `RF_MAX_LANES`, a malformed `RINGFENCE_*`
 * variable);
 * `RF_ENO_MEMORY` if the notification buffers (`notify_buffers` times
 * `notify_size` bytes) exceed the memory limit (see `rf_mem_alloc`) or
 * cannot be allocated; a large pool is not touched here: the kernel
 * zeroes its pages as buffers are first used;
 * `RF_EIO` if a driver or the core thread cannot start. `*worker` is
 * written only on success.
 *
 * # Safety
 * - `config` is NULL or points to a readable `struct rf_worker_config`
 *   whose `drivers` is NULL or a NUL-terminated string.
 * - `worker` is NULL or points to a writable `rf_worker_t`.
 */
int rf_worker_create(const struct rf_worker_config *config, rf_worker_t *worker);

/**
 * Destroys a worker: stops its core thread, cancels what is outstanding,
 * and frees its registrations (memory from `rf_mem_alloc` included).
 *
 * Returns 0; `RF_ESTALE_HANDLE` for a destroyed worker (a second destroy
 * included); `RF_EINVALID_ARGUMENT` for 0 or a handle that is not a
 * worker's; `RF_EBUSY` while one of its rings lives (destroy rings
 * first).
 */
int rf_worker_destroy(rf_worker_t worker);

/**
 * Copies the worker's address (for peers' `rf_ep_connect`) into `buf` and
 * its length into `*len`. With `buf` NULL and `cap` 0, only `*len` is
 * written (a size query).
 *
 * Returns 0; `RF_ETRUNCATED` if `cap` is too small (`*len` holds the size
 * needed); `RF_EINVALID_ARGUMENT` for a NULL `len`, or a NULL `buf` with
 * a non-zero `cap`; `RF_ESTALE_HANDLE`.
 *
 * # Safety
 * - `buf` is NULL or points to `cap` writable bytes.
 * - `len` is NULL or points to a writable `size_t`.
 */
int rf_worker_address(rf_worker_t worker, void *buf, size_t cap, size_t *len);

/**
 * Connects to the peer whose address (from its `rf_worker_address`) is
 * the `len` bytes at `addr`; stores the endpoint id for SQEs in `*ep`.
 *
 * Never blocks on the peer: the endpoint is usable at once. A driver that
 * needs a handshake (tcp, verbs) finishes it through progress; SQEs
 * submitted meanwhile queue in order and start once it is up, or each
 * completes with the handshake's error. `rf_ep_state` tells where it is.
 *
 * Returns 0; `RF_EINVALID_ARGUMENT` for NULL pointers, or an address
 * that is malformed or damaged (it fails its integrity check: a flipped
 * bit, cut short, bytes after its end); `RF_EINVALID_LENGTH` for a zero
 * `len` or one over
 * `RF_MAX_BLOB`; `RF_EPEER_UNREACHABLE` if no driver is shared or the peer
 * is known unreachable at once; `RF_ESTALE_HANDLE`.
 *
 * # Safety
 * - `addr` is NULL or points to `len` readable bytes.
 * - `ep` is NULL or points to a writable `uint32_t`.
 */
int rf_ep_connect(rf_worker_t worker, const void *addr, size_t len, uint32_t *ep);

/**
 * Where endpoint `ep` is: `RF_EP_CONNECTING`, `RF_EP_CONNECTED`,
 * `RF_EP_CLOSING`, `RF_EP_FAILED` (its sticky first error, a negative
 * `rf_status`, is stored in `*error` when `error` is not NULL) or
 * `RF_EP_CLOSED`. A snapshot: progress may change it at any time.
 *
 * Returns the state (non-negative); `RF_EINVALID_ENDPOINT` for an id
 * `rf_ep_connect` did not hand out; `RF_ESTALE_HANDLE`;
 * `RF_EINVALID_ARGUMENT` for a handle that is not a worker's.
 *
 * # Safety
 * - `error` is NULL or points to a writable `int`.
 */
int rf_ep_state(rf_worker_t worker, uint32_t ep, int *error);

/**
 * Stores a snapshot of endpoint `ep`'s fence engine in `*state`: its
 * epochs, dirty and covered lanes, the fence flush in flight, the weak
 * admission, the deferred and in-flight counts, and its fence and flush
 * counters by cause.
 *
 * Returns 0; `RF_EINVALID_ARGUMENT` if `state` is NULL or misaligned;
 * `RF_EINVALID_ENDPOINT` for an id `rf_ep_connect` did not hand out;
 * `RF_ESTALE_HANDLE`.
 *
 * # Safety
 * - `state` is NULL or points to a writable `struct rf_fence_state`.
 */
int rf_ep_fence_state(rf_worker_t worker, uint32_t ep, struct rf_fence_state *state);

/**
 * One bounded round of progress on the caller's thread: drains the rings'
 * SQs, advances fences, polls the drivers, posts CQEs.
 *
 * Returns how much work it did (0: nothing to do);
 * `RF_ERING_CORRUPT` while a ring of this worker that the engine failed
 * (it found the ring memory corrupt; see the inline helpers' "A failed
 * ring") is not destroyed yet: the round ran all the same, and the other
 * rings keep working; that ring's own calls (`rf_ring_check`,
 * `rf_wait_cqes`, `rf_peek_cqe`) say which it is; `rf_ring_destroy` it.
 * Or `RF_ESTALE_HANDLE`/`RF_EINVALID_ARGUMENT`. Takes no global lock other
 * than the handle table's read lock.
 */
int rf_progress(rf_worker_t worker);

/**
 * Starts the worker's core thread, which runs progress and busy-polls,
 * sleeping only when nothing is in flight (an `rf_submit` wakes it).
 * `cpu` >= 0 pins it to that CPU; negative: `RINGFENCE_CORE_CPU`, else
 * not pinned.
 *
 * Returns 0; `RF_EBUSY` if one runs already; `RF_EIO` (or the reason) if
 * the CPU cannot be used; `RF_ESTALE_HANDLE`.
 */
int rf_core_thread_start(rf_worker_t worker, int cpu);

/**
 * Stops the core thread, if one runs (waits for it); progress is then the
 * caller's (`rf_progress`).
 *
 * Returns 0 or `RF_ESTALE_HANDLE`/`RF_EINVALID_ARGUMENT`.
 */
int rf_core_thread_stop(rf_worker_t worker);

/**
 * A static, NUL-terminated description of any status or result: "success"
 * for zero and above, the status's message for a known negative value,
 * "unknown status" otherwise. Never NULL.
 */
const char *rf_strerror(int status);

/**
 * The library version, `major << 16 | minor << 8 | patch`; compare with
 * the header's `RF_VERSION`.
 */
uint32_t rf_version(void);

#ifdef __cplusplus
}  // extern "C"
#endif  // __cplusplus

#endif  /* RINGFENCE_H */

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
