/* internal.h — state shared by the files of libtailscope.
 *
 * Two kinds of state:
 *   - struct ts_process: one per process (the shm region, the sampling
 *     configuration, the mapped kernel-counter array). Written at init,
 *     at fork, and (for the kcounters mapping) rarely under a trylock.
 *   - struct ts_thread: one per thread, in initial-exec TLS so that the
 *     hot path reaches it with a %fs-relative access and no call. The
 *     fields the unsampled path touches (countdown, active) come first.
 */
#ifndef TS_INTERNAL_H
#define TS_INTERNAL_H

#include <stdint.h>
#include <pthread.h>
#include "tailscope/abi.h"

#define TS_LIKELY(x) __builtin_expect(!!(x), 1)
#define TS_UNLIKELY(x) __builtin_expect(!!(x), 0)
#define TS_TLS __thread __attribute__((tls_model("initial-exec")))
#define TS_HIDDEN __attribute__((visibility("hidden")))

/* Countdown values that mean "never sample" or "look again later". */
#define TS_COUNTDOWN_NEVER INT64_MAX
#define TS_COUNTDOWN_IDLE 65536 /* rate 0 / no agent: re-check this often */
#define TS_COUNTDOWN_CAP (1LL << 30)

/* ts_thread.state */
#define TS_THREAD_NEW 0   /* first call not seen yet */
#define TS_THREAD_READY 1 /* has a slot */
#define TS_THREAD_MUTE 2  /* no slot or runtime disabled: never records */
#define TS_THREAD_DEAD 3  /* past its TSD destructor */

/* A snapshot of a thread's cumulative kernel counters. */
struct ts_kc_snap {
	uint64_t oncpu_ns;
	uint64_t runnable_ns;
	uint64_t blocked_ns;
	uint64_t irq_ns;
	uint64_t softirq_ns;
	uint32_t counts[9]; /* runnable_count .. invol_switches, ABI order */
};

/* ts_kc_snapshot() result */
#define TS_SNAP_NONE 0 /* no kcounters entry for this thread */
#define TS_SNAP_OK 1
#define TS_SNAP_TORN 2 /* entry kept changing; snapshot best-effort */

struct ts_thread {
	int64_t countdown; /* requests until the next sampled one */
	uint32_t active;   /* a sampled request is open */
	uint32_t state;    /* TS_THREAD_* */
	uint64_t cur_id;
	uint64_t start_ns;
	uint16_t kind;
	uint16_t snap_state; /* TS_SNAP_* of the begin snapshot */
	uint32_t tid;
	int sample_at_zero;          /* the countdown was drawn at a rate > 0 */
	uint32_t kc_idx;             /* kcounters entry index, 0 = none */
	uint32_t gate;               /* header burst_gate when the open sampled request began */
	struct ts_kcounters *kc_map; /* the mapping kc_idx belongs to */
	uint64_t rng;                /* xorshift64* state */
	struct ts_thread_slot *slot;
	struct ts_kc_snap snap; /* counters at begin */
	/* LDB */
	struct ts_shadow_stack *shadow;      /* hooks' fast path; NULL: take the slow path */
	struct ts_shadow_stack *shadow_slow; /* the stack, once attached */
	uint32_t fn_clock;                   /* stamp frame entries (TAILSCOPE_FN_CLOCK=1) */
	uint32_t in_attach;                  /* recursion guard for shadow_attach */
};

struct ts_process {
	int enabled; /* region mapped and usable */
	int debug;
	int pid;
	uint32_t sample_ppm; /* runtime's own rate */
	struct ts_region_header *hdr;
	struct ts_thread_slot *slots;
	size_t region_size;
	char path[64];
	pthread_key_t key; /* TSD destructor marks the slot EXITED */
	pthread_mutex_t kind_lock;
	/* kernel-counter array, mapped on demand */
	struct ts_kcounters *kc; /* NULL until mapped; never unmapped */
	uint32_t kc_maps;        /* mappings made so far (bounded) */
	uint64_t kc_next_try_ns; /* rate limit for failed opens */
	pthread_mutex_t kc_lock; /* only ever trylock'ed */
	uint32_t fn_clock;       /* TAILSCOPE_FN_CLOCK=1 */
	/* The heartbeat of an agent found gone (its event rings full and its
	 * heartbeat stale): lock and request events stop until the header
	 * carries another heartbeat. UINT64_MAX: none. */
	uint64_t ldb_dead_hb;
};

extern struct ts_process ts_proc TS_HIDDEN;

/* Lock and request events are wanted: an agent's --functions flag is set
 * (flag) and its heartbeat is not one found dead (events.c). */
static inline int ts_ldb_on(const struct ts_region_header *h, uint32_t flag)
{
	return h && (__atomic_load_n(&h->ldb_flags, __ATOMIC_RELAXED) & flag) &&
	       __atomic_load_n(&h->agent_heartbeat_ns, __ATOMIC_RELAXED) !=
	           __atomic_load_n(&ts_proc.ldb_dead_hb, __ATOMIC_RELAXED);
}

/* Wakes an agent sleeping on the region's drain futex (request.c). */
void ts_wake_agent(void) TS_HIDDEN;
extern TS_TLS struct ts_thread ts_self TS_HIDDEN;

/* region.c */
void ts_debug(const char *fmt, ...) TS_HIDDEN __attribute__((format(printf, 1, 2)));
int ts_process_ready(void) TS_HIDDEN;
uint64_t ts_now_ns(void) TS_HIDDEN;
uint32_t ts_parse_sample(const char *s, uint32_t dflt) TS_HIDDEN;

/* slot.c */
int ts_thread_init(struct ts_thread *t) TS_HIDDEN;
void ts_thread_reset_after_fork(struct ts_thread *t) TS_HIDDEN;
void ts_slot_exit(void *slot) TS_HIDDEN;

/* sample.c */
uint32_t ts_current_ppm(void) TS_HIDDEN;
void ts_sample_seed(struct ts_thread *t) TS_HIDDEN;
void ts_sample_redraw(struct ts_thread *t) TS_HIDDEN;
double ts_ln(double x) TS_HIDDEN;

/* shadow.c */
void ts_shadow_reset(struct ts_shadow_stack *s) TS_HIDDEN;
void ts_shadow_detach(struct ts_thread *t) TS_HIDDEN;

/* events.c */
int ts_event_push3(struct ts_thread *t, const struct ts_event *ev, int n) TS_HIDDEN;
uint64_t ts_mutex_thresh_ns(void) TS_HIDDEN;

/* kcounters.c */
int ts_kc_begin(struct ts_thread *t, uint64_t now) TS_HIDDEN;
int ts_kc_snapshot(struct ts_thread *t, uint64_t now, struct ts_kc_snap *s) TS_HIDDEN;

#endif /* TS_INTERNAL_H */
