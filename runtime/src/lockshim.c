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
 * uncontended lock takes no clock before it), a clock read after
 * acquiring and one after releasing.
 *
 * pthread_cond_wait releases the mutex while it waits: the hold before it
 * ends there, and a new hold starts when it returns (its wait for the
 * condition is not a lock wait and is not logged as one).
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <pthread.h>
#include <time.h>

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

struct ts_held {
	const pthread_mutex_t *m;
	uint64_t wait_start_ns; /* 0: acquired without waiting */
	uint64_t acquired_ns;
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

static NOINST inline int locks_on(void)
{
	struct ts_region_header *h = __atomic_load_n(&ts_proc.hdr, __ATOMIC_RELAXED);
	return h && (__atomic_load_n(&h->ldb_flags, __ATOMIC_RELAXED) & TS_LDB_LOCKS);
}

static NOINST void held_push(const pthread_mutex_t *m, uint64_t wait_start, uint64_t acquired)
{
	if (ts_held.n < TS_HELD_MAX)
		ts_held.h[ts_held.n++] = (struct ts_held){m, wait_start, acquired};
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

/* After the unlock: log the episode if it waited or held long enough. */
static NOINST void held_log(const struct ts_held *e, uint64_t released)
{
	if (!locks_on())
		return; /* the recording ended while it was held */
	uint64_t thresh = ts_mutex_thresh_ns();
	uint64_t wait = e->wait_start_ns ? e->acquired_ns - e->wait_start_ns : 0;
	uint64_t hold = released - e->acquired_ns;
	if (wait <= thresh && hold <= thresh)
		return;
	struct ts_event ev[3];
	int n = 0;
	uint64_t obj = (uint64_t)(uintptr_t)e->m;
	if (e->wait_start_ns)
		ev[n++] = (struct ts_event){
		    .ts_ns = e->wait_start_ns, .object = obj, .type = TS_EV_MUTEX_WAIT};
	ev[n++] =
	    (struct ts_event){.ts_ns = e->acquired_ns, .object = obj, .type = TS_EV_MUTEX_LOCK};
	ev[n++] = (struct ts_event){.ts_ns = released, .object = obj, .type = TS_EV_MUTEX_UNLOCK};
	ts_event_push3(&ts_self, ev, n);
}

static NOINST __attribute__((noinline)) int lock_slow(pthread_mutex_t *m)
{
	uint64_t wait_start = 0;
	if (real_mutex_trylock(m) != 0) {
		wait_start = now_ns();
		int rc = real_mutex_lock(m);
		if (rc != 0)
			return rc;
	}
	held_push(m, wait_start, now_ns());
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
	if (TS_UNLIKELY(rc == 0 && locks_on()))
		held_push(m, 0, now_ns());
	return rc;
}

NOINST int pthread_mutex_unlock(pthread_mutex_t *m)
{
	if (TS_LIKELY(ts_held.n == 0))
		return real_mutex_unlock(m);
	struct ts_held e;
	int had = held_pop(m, &e);
	int rc = real_mutex_unlock(m);
	if (had && rc == 0)
		held_log(&e, now_ns());
	return rc;
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
	if (held_pop(m, &e))
		held_log(&e, now_ns());
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
	if (locks_on())
		held_push(m, 0, now_ns());
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
	if (locks_on())
		held_push(m, 0, now_ns());
	return rc;
}

/* Tell the agent the shim is here (the linker pulled this file in). */
__attribute__((constructor)) static NOINST void lockshim_announce(void)
{
	if (ts_process_ready())
		__atomic_fetch_or(&ts_proc.hdr->features, TS_FEAT_LOCK_SHIM, __ATOMIC_RELAXED);
}
