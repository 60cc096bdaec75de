/* lockshim.c — interposed pthread mutex calls: lock waits and holds (LDB).
 *
 * Linking libtailscope puts these definitions of pthread_mutex_lock,
 * pthread_mutex_trylock, pthread_mutex_unlock, pthread_cond_wait and
 * pthread_cond_timedwait ahead of glibc's. Each forwards to glibc
 * (glibc's __pthread_mutex_* entry points, bound by .symver; the condition variable
 * calls are looked up once with dlvsym). While an agent records with
 * --functions (header.ldb_flags has TS_LDB_LOCKS), a lock also notes when
 * it began waiting and when it acquired the mutex, in a small per-thread
 * table of held mutexes; unlock then decides, outside the critical
 * section, whether to log it: when the wait or the hold exceeded the
 * threshold (1 us, or the agent's), it pushes MUTEX_WAIT (if it waited),
 * MUTEX_LOCK and MUTEX_UNLOCK into the thread's event ring.
 *
 * Cost when not recording: a load of the header pointer and of ldb_flags,
 * a branch, and the call into glibc. When recording: a trylock first (an
 * uncontended lock takes no time stamp before it), a time stamp after
 * acquiring and one just before releasing. The two stamps are most of it:
 * an rdtsc next to a locked instruction costs ~12 ns on the development VM
 * (~8.6 ns back to back). The rest is kept to a few loads and stores: the
 * held entry carries its deadline (the stamp past which the hold may be
 * over the threshold), so the unlock compares one value and tail-calls
 * glibc (bench/ldb/lockbench, session 11, a parked second thread so that
 * glibc takes its lock prefix: glibc 15.6 ns per pair, recording 51.9 ns
 * before this layout).
 *
 * Time stamps are raw TSC reads (rdtsc, ~16 ns on the development VM
 * against ~28 ns for clock_gettime, which reads the TSC too and adds its
 * seqlock and scaling) when the kernel's clocksource is the TSC (then it
 * is synchronised across CPUs and constant-rate). Ticks become
 * nanoseconds only for an episode that is logged: the scale (ns per tick,
 * 32.32 fixed point) is measured by the shim itself, from two
 * (clock_gettime, rdtsc) pairs at least 2 ms apart, and refined as the
 * span grows; an episode's stamps are converted relative to the thread's
 * anchor, a clock_gettime read at most 1 ms before the episode was logged
 * (anchor_ns), so its error is the scale's error times the episode's age
 * plus 1 ms (~10 ppm after calibration: ~0.1 us on a 10 ms hold). Until
 * the scale is known (the first 2 ms of locking), or on another
 * clocksource, or with TAILSCOPE_LOCK_CLOCK=mono, stamps are
 * clock_gettime(CLOCK_MONOTONIC) as before. Each held entry remembers
 * which kind its stamps are.
 *
 * pthread_cond_wait releases the mutex while it waits: the hold before it
 * ends there, and a new hold starts when it returns (its wait for the
 * condition is not a lock wait and is not logged as one).
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <pthread.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <x86intrin.h>

#include "internal.h"

#define NOINST __attribute__((no_instrument_function))
#define TS_HELD_MAX 16

/* glibc's own entry points under their exported compat names (x86-64). */
extern int real_mutex_lock(pthread_mutex_t *m);
extern int real_mutex_trylock(pthread_mutex_t *m);
extern int real_mutex_unlock(pthread_mutex_t *m);
__asm__(".symver real_mutex_lock,__pthread_mutex_lock@GLIBC_2.2.5");
__asm__(".symver real_mutex_trylock,__pthread_mutex_trylock@GLIBC_2.2.5");
__asm__(".symver real_mutex_unlock,__pthread_mutex_unlock@GLIBC_2.2.5");

/* A mutex this thread holds. `deadline` is decided when it is acquired:
 * the stamp after which its release may be over the threshold (acquired +
 * the threshold in the stamps' unit, rounded down; 0 when the wait alone
 * may be over it). The unlock path compares its stamp with it and nothing
 * else; held_log makes the exact test in ns for the few that pass. */
struct ts_held {
	const pthread_mutex_t *m;
	uint64_t acquired;
	uint64_t deadline;
	uint64_t wait_start; /* 0: acquired without waiting */
	uint64_t tsc;        /* stamps are TSC ticks (else CLOCK_MONOTONIC ns) */
};

static TS_TLS struct {
	uint32_t n;
	struct ts_held h[TS_HELD_MAX];
} ts_held;

static NOINST uint64_t now_ns(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

/* ---- time stamps: TSC ticks once calibrated --------------------------- */

#define TSC_CAL_NS 2000000ull /* first calibration span */

enum { TSC_UNKNOWN, TSC_ANCHORING, TSC_ANCHORED, TSC_NEVER };

static struct {
	int state;    /* TSC_* */
	uint64_t ns0; /* the anchor pair */
	uint64_t tsc0;
	uint64_t mult;    /* ns per tick, 32.32; 0 until calibrated */
	uint64_t span_ns; /* the span mult was measured over */
} ts_tsc;

static NOINST inline uint64_t ticks_ns(uint64_t ticks, uint64_t mult)
{
	return (uint64_t)(((unsigned __int128)ticks * mult) >> 32);
}

/* A (clock_gettime, rdtsc) pair: the TSC read is the midpoint of two.
 * A pair whose bracket is wide (the thread was preempted or interrupted
 * between the reads: the midpoint can then be tens of us off the clock
 * read, which a CI run showed as a 26 us error in a converted stamp and a
 * 2300 ppm error in a 2 ms calibration) is taken again; of up to
 * TS_PAIR_TRIES pairs the narrowest is kept. An undisturbed pair brackets
 * ~100 ticks. */
#define TS_PAIR_TIGHT 500u /* ticks: <= 0.25 us at >= 2 GHz (midpoint error <= half) */
#define TS_PAIR_TRIES 6
static NOINST uint64_t clock_pair_w(uint64_t *tsc, uint64_t *width)
{
	uint64_t best_ns = 0, best_w = UINT64_MAX;
	for (int i = 0; i < TS_PAIR_TRIES; i++) {
		uint64_t a = __rdtsc();
		uint64_t ns = now_ns();
		uint64_t b = __rdtsc();
		uint64_t w = b >= a ? b - a : UINT64_MAX;
		if (w < best_w) {
			best_w = w;
			best_ns = ns;
			*tsc = a + w / 2;
		}
		if (w <= TS_PAIR_TIGHT)
			break;
	}
	if (best_w == UINT64_MAX) /* (never: the TSC went backwards every time) */
		*tsc = __rdtsc();
	*width = best_w;
	return best_ns ? best_ns : now_ns();
}

static NOINST uint64_t clock_pair(uint64_t *tsc)
{
	uint64_t width;
	return clock_pair_w(tsc, &width);
}

/* Whether the kernel keeps time with the TSC (so it is synchronised and
 * constant-rate), and the user did not ask for clock_gettime stamps. */
static NOINST int tsc_trusted(void)
{
	const char *env = getenv("TAILSCOPE_LOCK_CLOCK");
	if (env && strcmp(env, "mono") == 0)
		return 0;
	char buf[16] = {0};
	int fd = open("/sys/devices/system/clocksource/clocksource0/current_clocksource",
	              O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return 0;
	ssize_t n = read(fd, buf, sizeof(buf) - 1);
	close(fd);
	return n >= 3 && strncmp(buf, "tsc", 3) == 0 && (n == 3 || buf[3] == '\n');
}

/* (Re)measure the scale when the anchor is at least `min_span` old. */
static NOINST void tsc_measure(uint64_t min_span)
{
	if (__atomic_load_n(&ts_tsc.state, __ATOMIC_ACQUIRE) != TSC_ANCHORED)
		return;
	uint64_t tsc, ns = clock_pair(&tsc);
	uint64_t dns = ns - ts_tsc.ns0, dt = tsc - ts_tsc.tsc0;
	if (ns < ts_tsc.ns0 || tsc <= ts_tsc.tsc0 || dns < min_span || dns >> 31)
		return; /* too early; or a span past 2 s (the scale is good by then) */
	__atomic_store_n(&ts_tsc.mult, (dns << 32) / dt, __ATOMIC_RELAXED);
	__atomic_store_n(&ts_tsc.span_ns, dns, __ATOMIC_RELAXED);
}

/* Slow path of a stamp while uncalibrated: anchor, or calibrate. */
static NOINST __attribute__((noinline)) void tsc_progress(void)
{
	int st = __atomic_load_n(&ts_tsc.state, __ATOMIC_ACQUIRE);
	if (st == TSC_UNKNOWN) {
		int expect = TSC_UNKNOWN;
		if (!__atomic_compare_exchange_n(&ts_tsc.state, &expect, TSC_ANCHORING, 0,
		                                 __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE))
			return;
		if (!tsc_trusted()) {
			__atomic_store_n(&ts_tsc.state, TSC_NEVER, __ATOMIC_RELEASE);
			return;
		}
		ts_tsc.ns0 = clock_pair(&ts_tsc.tsc0);
		__atomic_store_n(&ts_tsc.state, TSC_ANCHORED, __ATOMIC_RELEASE);
	} else if (st == TSC_ANCHORED) {
		tsc_measure(TSC_CAL_NS);
	}
}

/* The stamp kind to use for a new hold: TSC once calibrated. */
static NOINST inline int stamp_tsc(void)
{
	return __atomic_load_n(&ts_tsc.mult, __ATOMIC_RELAXED) != 0;
}

/* A stamp while uncalibrated or on another clocksource (out of line: the
 * TSC path below stays a single instruction in its callers). */
static NOINST __attribute__((noinline)) uint64_t stamp_mono(void)
{
	if (__atomic_load_n(&ts_tsc.state, __ATOMIC_RELAXED) != TSC_NEVER)
		tsc_progress();
	return now_ns();
}

static NOINST inline uint64_t stamp(int tsc)
{
	if (TS_LIKELY(tsc))
		return __rdtsc();
	return stamp_mono();
}

static NOINST inline int locks_on(void)
{
	struct ts_region_header *h = __atomic_load_n(&ts_proc.hdr, __ATOMIC_RELAXED);
	return ts_ldb_on(h, TS_LDB_LOCKS);
}

/* Removes m's entry (most recent first); returns 1 and the entry if held. */
static NOINST int held_pop(const pthread_mutex_t *m, struct ts_held *out)
{
	for (uint32_t i = ts_held.n; i-- > 0;) {
		if (ts_held.h[i].m != m)
			continue;
		*out = ts_held.h[i];
		for (uint32_t j = i + 1; j < ts_held.n; j++)
			ts_held.h[j - 1] = ts_held.h[j];
		ts_held.n--;
		return 1;
	}
	return 0;
}

/* The threshold in TSC ticks, cached per thread for the (threshold, scale)
 * it was computed from: the unlock path compares raw tick differences and
 * converts only the episodes it logs. */
static TS_TLS struct {
	uint64_t thresh_ns;
	uint64_t mult;
	uint64_t ticks;
} ts_thresh_tsc;

static NOINST __attribute__((noinline)) uint64_t thresh_ticks_slow(uint64_t thresh, uint64_t mult)
{
	/* thresh * 2^32 / mult, rounded down: an episode of more ticks may be
	 * over the threshold (held_log decides in ns), one of fewer is not. */
	uint64_t ticks = mult ? (uint64_t)(((unsigned __int128)thresh << 32) / mult) : UINT64_MAX;
	ts_thresh_tsc.thresh_ns = thresh;
	ts_thresh_tsc.mult = mult;
	ts_thresh_tsc.ticks = ticks;
	return ticks;
}

/* The threshold in the unit of a new hold's stamps (a few loads and
 * compares, no call). Read when the mutex is acquired: a threshold the
 * agent changes during a hold applies from the next one (held_log's exact
 * test uses the current one). */
static NOINST inline uint64_t thresh_limit(uint64_t tsc)
{
	/* ts_mutex_thresh_ns() without the call (events.c). */
	struct ts_region_header *h = __atomic_load_n(&ts_proc.hdr, __ATOMIC_RELAXED);
	uint64_t thresh = h ? __atomic_load_n(&h->mutex_thresh_ns, __ATOMIC_RELAXED) : 0;
	if (!thresh)
		thresh = TS_MUTEX_THRESH_NS;
	if (!tsc)
		return thresh;
	uint64_t mult = __atomic_load_n(&ts_tsc.mult, __ATOMIC_RELAXED);
	return TS_LIKELY(ts_thresh_tsc.thresh_ns == thresh && ts_thresh_tsc.mult == mult)
	           ? ts_thresh_tsc.ticks
	           : thresh_ticks_slow(thresh, mult);
}

static NOINST inline void held_fill(uint32_t n, const pthread_mutex_t *m, uint64_t wait_start,
                                    uint64_t acquired, uint64_t tsc, uint64_t limit)
{
	uint64_t deadline = acquired + limit < acquired ? UINT64_MAX : acquired + limit;
	if (TS_UNLIKELY(wait_start && acquired > wait_start && acquired - wait_start > limit))
		deadline = 0; /* the wait may be over the threshold: any release decides */
	struct ts_held *e = &ts_held.h[n];
	e->m = m;
	e->acquired = acquired;
	e->deadline = deadline;
	e->wait_start = wait_start;
	e->tsc = tsc;
	ts_held.n = n + 1;
}

/* Notes a mutex acquired at `acquired` (after waiting since `wait_start`,
 * or 0). Past TS_HELD_MAX nested holds the mutex is not followed. */
static NOINST __attribute__((noinline)) void
held_push_slow(const pthread_mutex_t *m, uint64_t wait_start, uint64_t acquired, uint64_t tsc)
{
	uint32_t n = ts_held.n;
	if (n < TS_HELD_MAX)
		held_fill(n, m, wait_start, acquired, tsc, thresh_limit(tsc));
}

/* held_push_slow's common case inline: TSC stamps and the cached limit
 * (the rest is out of line, so callers save no registers for it). */
static NOINST inline void held_push(const pthread_mutex_t *m, uint64_t wait_start,
                                    uint64_t acquired, uint64_t tsc)
{
	uint32_t n = ts_held.n;
	struct ts_region_header *h = __atomic_load_n(&ts_proc.hdr, __ATOMIC_RELAXED);
	uint64_t thresh = h ? __atomic_load_n(&h->mutex_thresh_ns, __ATOMIC_RELAXED) : 0;
	if (!thresh)
		thresh = TS_MUTEX_THRESH_NS;
	if (TS_LIKELY(n < TS_HELD_MAX && tsc && ts_thresh_tsc.thresh_ns == thresh &&
	              ts_thresh_tsc.mult == __atomic_load_n(&ts_tsc.mult, __ATOMIC_RELAXED)))
		held_fill(n, m, wait_start, acquired, tsc, ts_thresh_tsc.ticks);
	else
		held_push_slow(m, wait_start, acquired, tsc);
}

/* Ticks to CLOCK_MONOTONIC ns for logged episodes, relative to this
 * thread's anchor: a (clock_gettime, rdtsc) pair taken again when it is
 * older than TS_ANCHOR_NS (or the scale changed). Session 8 took a pair for
 * every logged episode: a clock_gettime (~40 ns on this VM) between two
 * rdtsc (~21 ns each), up to TS_PAIR_TRIES times, ~0.9 times per memcached
 * SET at the 1 us threshold; now at most 1000 pairs a second per thread.
 * The conversion error is the scale's error times the distance to the
 * anchor (<= 1 ms: ~10 ns at 10 ppm) plus the pair's bracket (<= 0.25 us),
 * as before; per thread, so no shared cache line is written. */
#define TS_ANCHOR_NS 1000000ull
static TS_TLS struct {
	uint64_t tsc, ns, mult;
} ts_anchor;

static NOINST __attribute__((noinline)) void anchor_refresh(uint64_t mult)
{
	uint64_t width, tsc_now, ns_now = clock_pair_w(&tsc_now, &width);
	ts_anchor.tsc = tsc_now;
	ts_anchor.ns = ns_now;
	/* A pair that stayed wide after every try (the thread was preempted
	 * each time) serves this episode only: kept as the anchor it would
	 * shift every episode of the next 1 ms by up to half its bracket. */
	ts_anchor.mult = width <= TS_PAIR_TIGHT ? mult : 0;
	/* A longer span measures the scale better: refine it now and then
	 * (tsc_measure takes no span past 2^31 ns, so stop asking before). */
	uint64_t span = __atomic_load_n(&ts_tsc.span_ns, __ATOMIC_RELAXED);
	if (span < (1ull << 31) / 8 && ns_now - ts_tsc.ns0 >= 8 * span)
		tsc_measure(0);
}

static NOINST uint64_t anchor_ns(uint64_t tsc, uint64_t mult)
{
	if (TS_UNLIKELY(ts_anchor.mult != mult || tsc < ts_anchor.tsc ||
	                ticks_ns(tsc - ts_anchor.tsc, mult) > TS_ANCHOR_NS))
		anchor_refresh(mult);
	if (tsc >= ts_anchor.tsc)
		return ts_anchor.ns + ticks_ns(tsc - ts_anchor.tsc, mult);
	return ts_anchor.ns - ticks_ns(ts_anchor.tsc - tsc, mult);
}

/* After the unlock: log the episode if it waited or held long enough. */
static NOINST __attribute__((noinline)) void held_log(const struct ts_held *e, uint64_t released)
{
	if (!locks_on())
		return; /* the recording ended while it was held */
	if (released < e->acquired)
		released = e->acquired; /* (TSC reads on two CPUs: never seen, but bounded) */
	uint64_t mult = e->tsc ? __atomic_load_n(&ts_tsc.mult, __ATOMIC_RELAXED) : 1ull << 32;
	uint64_t wait = e->wait_start && e->acquired > e->wait_start
	                    ? ticks_ns(e->acquired - e->wait_start, mult)
	                    : 0;
	uint64_t hold = ticks_ns(released - e->acquired, mult);
	uint64_t thresh = ts_mutex_thresh_ns();
	if (wait <= thresh && hold <= thresh)
		return; /* the unlock's deadline rounds down: the exact test is here */
	uint64_t w = e->wait_start, a = e->acquired, r = released;
	if (e->tsc) {
		r = anchor_ns(r, mult);
		a = r - hold;
		w = w ? a - wait : 0;
	}
	struct ts_event ev[3];
	int n = 0;
	uint64_t obj = (uint64_t)(uintptr_t)e->m;
	if (e->wait_start)
		ev[n++] = (struct ts_event){.ts_ns = w, .object = obj, .type = TS_EV_MUTEX_WAIT};
	ev[n++] = (struct ts_event){.ts_ns = a, .object = obj, .type = TS_EV_MUTEX_LOCK};
	ev[n++] = (struct ts_event){.ts_ns = r, .object = obj, .type = TS_EV_MUTEX_UNLOCK};
	ts_event_push3(&ts_self, ev, n);
}

static NOINST __attribute__((noinline)) int lock_wait(pthread_mutex_t *m)
{
	int tsc = stamp_tsc();
	uint64_t wait_start = stamp(tsc);
	int rc = real_mutex_lock(m);
	if (rc != 0)
		return rc;
	held_push(m, wait_start, stamp(tsc), (uint64_t)tsc);
	return 0;
}

static NOINST __attribute__((noinline)) int lock_slow(pthread_mutex_t *m)
{
	if (TS_UNLIKELY(real_mutex_trylock(m) != 0))
		return lock_wait(m);
	if (TS_LIKELY(stamp_tsc()))
		held_push(m, 0, __rdtsc(), 1);
	else
		held_push_slow(m, 0, stamp_mono(), 0);
	return 0;
}

NOINST int pthread_mutex_lock(pthread_mutex_t *m)
{
	if (TS_LIKELY(!locks_on()))
		return real_mutex_lock(m);
	return lock_slow(m);
}

NOINST int pthread_mutex_trylock(pthread_mutex_t *m)
{
	int rc = real_mutex_trylock(m);
	if (TS_UNLIKELY(rc == 0 && locks_on())) {
		int tsc = stamp_tsc();
		held_push(m, 0, stamp(tsc), (uint64_t)tsc);
	}
	return rc;
}

/* The release stamp is taken just before glibc's unlock (the hold ends
 * when this thread lets go; a stamp after the locked instruction of the
 * unlock costs ~6 ns more per pair here), and an episode is logged after
 * it, outside the critical section. */

/* The latest lock's hold passed its deadline: pop, unlock, then log. */
static NOINST __attribute__((noinline)) int unlock_log(pthread_mutex_t *m, uint32_t n,
                                                       uint64_t released)
{
	struct ts_held e = ts_held.h[n - 1];
	ts_held.n = n - 1;
	int rc = real_mutex_unlock(m);
	if (rc == 0)
		held_log(&e, released);
	return rc;
}

/* An unlock of a followed mutex that is not the latest one locked. */
static NOINST __attribute__((noinline)) int unlock_other(pthread_mutex_t *m)
{
	struct ts_held e;
	int had = held_pop(m, &e);
	uint64_t released = had ? stamp((int)e.tsc) : 0;
	int rc = real_mutex_unlock(m);
	if (had && rc == 0 && TS_UNLIKELY(released > e.deadline))
		held_log(&e, released);
	return rc;
}

/* The common case while recording (m is the latest mutex locked, with TSC
 * stamps, its hold short): a stamp, one compare with the entry's deadline,
 * the pop, and a tail call into glibc. Every other case is a tail call too,
 * so this saves no registers. */
static NOINST __attribute__((noinline)) int unlock_held(pthread_mutex_t *m, uint32_t n)
{
	const struct ts_held *top = &ts_held.h[n - 1];
	if (TS_UNLIKELY(n > TS_HELD_MAX || top->m != m || !top->tsc))
		return unlock_other(m); /* (it finds the latest one first) */
	uint64_t released = __rdtsc();
	if (TS_UNLIKELY(released > top->deadline))
		return unlock_log(m, n, released);
	ts_held.n = n - 1;
	return real_mutex_unlock(m);
}

NOINST int pthread_mutex_unlock(pthread_mutex_t *m)
{
	uint32_t n = ts_held.n;
	if (TS_LIKELY(n == 0))
		return real_mutex_unlock(m);
	return unlock_held(m, n);
}

/* ---- condition variables -------------------------------------------- */

typedef int (*cond_wait_fn)(pthread_cond_t *, pthread_mutex_t *);
typedef int (*cond_timedwait_fn)(pthread_cond_t *, pthread_mutex_t *, const struct timespec *);

static NOINST void *real_symbol(void **cache, const char *name)
{
	void *f = __atomic_load_n(cache, __ATOMIC_ACQUIRE);
	if (f)
		return f;
	f = dlvsym(RTLD_NEXT, name, "GLIBC_2.3.2");
	if (!f)
		f = dlsym(RTLD_NEXT, name);
	__atomic_store_n(cache, f, __ATOMIC_RELEASE);
	return f;
}

static void *real_cond_wait, *real_cond_timedwait;

/* The hold ends while the condition wait releases the mutex. */
static NOINST void cond_release(pthread_mutex_t *m)
{
	struct ts_held e;
	if (held_pop(m, &e)) {
		uint64_t released = stamp((int)e.tsc);
		if (released > e.deadline)
			held_log(&e, released);
	}
}

NOINST int pthread_cond_wait(pthread_cond_t *c, pthread_mutex_t *m)
{
	cond_wait_fn f = (cond_wait_fn)real_symbol(&real_cond_wait, "pthread_cond_wait");
	if (!f)
		return EINVAL;
	if (TS_LIKELY(ts_held.n == 0 && !locks_on()))
		return f(c, m);
	cond_release(m);
	int rc = f(c, m);
	if (locks_on()) {
		int tsc = stamp_tsc();
		held_push(m, 0, stamp(tsc), (uint64_t)tsc);
	}
	return rc;
}

NOINST int pthread_cond_timedwait(pthread_cond_t *c, pthread_mutex_t *m,
                                  const struct timespec *abstime)
{
	cond_timedwait_fn f =
	    (cond_timedwait_fn)real_symbol(&real_cond_timedwait, "pthread_cond_timedwait");
	if (!f)
		return EINVAL;
	if (TS_LIKELY(ts_held.n == 0 && !locks_on()))
		return f(c, m, abstime);
	cond_release(m);
	int rc = f(c, m, abstime);
	if (locks_on()) {
		int tsc = stamp_tsc();
		held_push(m, 0, stamp(tsc), (uint64_t)tsc);
	}
	return rc;
}

/* Tell the agent the shim is here (the linker pulled this file in). */
__attribute__((constructor)) static NOINST void lockshim_announce(void)
{
	if (ts_process_ready())
		__atomic_fetch_or(&ts_proc.hdr->features, TS_FEAT_LOCK_SHIM, __ATOMIC_RELAXED);
}
