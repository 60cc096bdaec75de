/* tailscope.h — the public API of libtailscope.
 *
 * Wrap each request a service handles in a begin/end pair:
 *
 *     static int get_kind;                     // cache it; lookup is not hot
 *     if (!get_kind) get_kind = tailscope_kind("GET");
 *     tailscope_request_begin_kind(id, get_kind);
 *     ... handle the request ...
 *     tailscope_request_end(id);
 *
 * A sampled fraction of requests (env TAILSCOPE_SAMPLE, default 1%, or the
 * rate an attached agent sets) is recorded with its latency and the kernel
 * counters (on-CPU, runnable/blocked wait, irq, softirq, faults, ...) that
 * the tailscope eBPF programs accumulate for the thread. Unsampled requests
 * cost a thread-local decrement and a branch. Nothing here allocates, takes
 * a lock or blocks; if anything fails the library silently disables itself
 * (TAILSCOPE_DEBUG=1 prints why to stderr).
 *
 * Environment:
 *   TAILSCOPE_SAMPLE   "0.01" (fraction), "1%" (percent), "10000ppm" or a
 *                      bare integer > 1 (ppm). "1" means 100%, "0" nothing.
 *   TAILSCOPE_DISABLE  "1": do nothing at all (no shm region either).
 *   TAILSCOPE_DEBUG    "1": print lifecycle events and failures to stderr.
 *   TAILSCOPE_FN_CLOCK "1": -finstrument-functions hooks stamp each frame
 *                      with its entry time (exact starts, ~30 ns per call).
 *
 * Function-level latency (LDB): build with `tailscope flags` (or the
 * tailscope-cc wrapper), which adds -finstrument-functions and links this
 * library; its hooks keep a shadow stack per thread that
 * `tailscope record --functions` scans. Linking the library also
 * interposes pthread_mutex_lock/unlock/trylock and pthread_cond_wait to
 * log lock waits and holds above 1 us while such a recording runs.
 */
#ifndef TAILSCOPE_H
#define TAILSCOPE_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Register (or find) a request-kind label. Returns its id, 1..63, or 0 (the
 * unnamed kind) on failure or when the table is full. Takes a lock: call it
 * once per label and cache the result. Names longer than 23 bytes are cut. */
int tailscope_kind(const char *name);

/* Mark the start and the end of request `id` on the calling thread. The end
 * is matched to the begin by id; an end with no matching begin is ignored.
 * Requests on one thread are not nested: a sampled begin replaces any
 * sampled request still open on that thread. */
void tailscope_request_begin(uint64_t id);
void tailscope_request_begin_kind(uint64_t id, int kind);
void tailscope_request_end(uint64_t id);

/* Requests handed between threads (LDB). Every call is recorded, not a
 * sample, while an agent records with --functions; otherwise each is one
 * load and a branch. `queue` is any address naming the software queue the
 * request waits in (or NULL); it is recorded, never dereferenced.
 *   start:   this thread starts or resumes work on request `id`;
 *   block:   this thread parks `id` in `queue` (another thread resumes it);
 *   end:     request `id` is finished;
 *   end_all: every request this thread holds is finished. */
void tailscope_req_start(uint64_t id, const void *queue);
void tailscope_req_block(uint64_t id, const void *queue);
void tailscope_req_end(uint64_t id);
void tailscope_req_end_all(void);

/* The sampling rate in effect (parts per million): the agent's override if
 * one is set, else the runtime's own; while the agent samples in burst
 * windows, the overall rate (not the higher in-window one). 0 when the
 * runtime is disabled. */
uint32_t tailscope_sample_ppm(void);

/* 1 if the runtime is active in this process (region created), else 0. */
int tailscope_enabled(void);

/* Path of this process's shared-memory region, or NULL when disabled. */
const char *tailscope_region_path(void);

#ifdef __cplusplus
}
#endif

#endif /* TAILSCOPE_H */
