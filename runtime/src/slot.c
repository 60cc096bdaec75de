/* slot.c — per-thread slots in the region.
 *
 * A thread gets a slot lazily, on its first API call. Claiming is lock
 * free: first bump the header's slots_used high-water mark, then (once all
 * TS_MAX_SLOTS have been handed out) look for a slot that is FREE, or
 * EXITED with its ring fully drained (ring_head == ring_tail). Either way
 * the claim is a CAS of `state`, so the runtime and an agent that recycles
 * EXITED slots (it must also CAS, EXITED -> FREE) never both own one. A
 * reused slot keeps its monotonic ring_head/ring_tail; the tid tells owners
 * apart. A thread that finds no slot bumps slots_exhausted and records
 * nothing, ever.
 *
 * A pthread key's destructor marks the slot EXITED when the thread ends.
 */
#define _GNU_SOURCE
#include <string.h>
#include <unistd.h>

#include "internal.h"

TS_TLS struct ts_thread ts_self;

static int slot_take(struct ts_thread_slot *s, uint32_t from)
{
	return __atomic_compare_exchange_n(&s->state, &from, TS_SLOT_LIVE, 0, __ATOMIC_ACQ_REL,
	                                   __ATOMIC_RELAXED);
}

static struct ts_thread_slot *slot_claim(void)
{
	struct ts_region_header *h = ts_proc.hdr;
	uint32_t used = __atomic_load_n(&h->slots_used, __ATOMIC_RELAXED);
	while (used < TS_MAX_SLOTS) {
		if (__atomic_compare_exchange_n(&h->slots_used, &used, used + 1, 0,
		                                __ATOMIC_ACQ_REL, __ATOMIC_RELAXED)) {
			if (slot_take(&ts_proc.slots[used], TS_SLOT_FREE))
				return &ts_proc.slots[used];
			break;
		}
	}
	/* An observer recording --functions hands EXITED slots back itself,
	 * after it has read their final shadow stack (TS_LDB_SLOTS): taking one
	 * before would hide the exited thread's last calls from it. So with an
	 * observer, a first scan takes only FREE slots; only if there is none
	 * (the observer is behind) does a second take a drained EXITED one, as
	 * without an observer: better a lost tail of an exited thread than a
	 * new thread that records nothing. */
	int observer = (__atomic_load_n(&h->ldb_flags, __ATOMIC_ACQUIRE) & TS_LDB_SLOTS) &&
	               __atomic_load_n(&h->agent_pid, __ATOMIC_RELAXED);
	for (int scan = observer ? 0 : 1; scan < 2; scan++) {
		for (uint32_t i = 0; i < TS_MAX_SLOTS; i++) {
			struct ts_thread_slot *s = &ts_proc.slots[i];
			uint32_t st = __atomic_load_n(&s->state, __ATOMIC_ACQUIRE);
			if (st == TS_SLOT_FREE && slot_take(s, TS_SLOT_FREE))
				return s;
			if (scan == 1 && st == TS_SLOT_EXITED &&
			    __atomic_load_n(&s->ring_tail, __ATOMIC_ACQUIRE) == s->ring_head &&
			    __atomic_load_n(&s->ev_tail, __ATOMIC_ACQUIRE) == s->ev_head &&
			    slot_take(s, TS_SLOT_EXITED))
				return s;
		}
	}
	__atomic_fetch_add(&h->slots_exhausted, 1, __ATOMIC_RELAXED);
	return NULL;
}

/* First call on this thread: claim a slot and seed the sampler. Returns 1
 * if the thread can record, 0 if it never will (state MUTE or DEAD). */
int ts_thread_init(struct ts_thread *t)
{
	if (t->state == TS_THREAD_DEAD || t->state == TS_THREAD_MUTE)
		return 0;
	t->tid = (uint32_t)gettid();
	if (!ts_process_ready())
		goto mute;
	struct ts_thread_slot *s = slot_claim();
	if (!s) {
		ts_debug("thread %u: no free slot (max %d)", t->tid, TS_MAX_SLOTS);
		goto mute;
	}
	ts_shadow_reset(&s->shadow); /* before the tid: the observer keys on it */
	s->tid = t->tid;
	s->cur_active = 0;
	t->slot = s;
	pthread_setspecific(ts_proc.key, s);
	ts_sample_seed(t);
	t->state = TS_THREAD_READY;
	return 1;
mute:
	t->state = TS_THREAD_MUTE;
	t->countdown = TS_COUNTDOWN_NEVER;
	return 0;
}

/* TSD destructor: the thread is ending. Close any open request and mark
 * the slot EXITED so the agent drains it and it can be reused. */
void ts_slot_exit(void *slot)
{
	struct ts_thread_slot *s = slot;
	struct ts_thread *t = &ts_self;
	uint64_t g = s->gen;
	__atomic_store_n(&s->gen, g + 1, __ATOMIC_RELAXED);
	__atomic_thread_fence(__ATOMIC_RELEASE);
	s->cur_active = 0;
	__atomic_store_n(&s->gen, g + 2, __ATOMIC_RELEASE);
	__atomic_store_n(&s->state, TS_SLOT_EXITED, __ATOMIC_RELEASE);
	/* Records left in the ring: an agent asleep until some ring fills
	 * would leave this slot unusable until its next timed drain. */
	if (__atomic_load_n(&s->ring_tail, __ATOMIC_ACQUIRE) != s->ring_head)
		ts_wake_agent();
	t->state = TS_THREAD_DEAD;
	t->active = 0;
	t->slot = NULL;
	ts_shadow_detach(t); /* hooks in later destructors write nowhere shared */
	t->countdown = TS_COUNTDOWN_NEVER;
}

/* In a fork child the calling thread's slot belongs to the parent's
 * region. Forget it; the thread re-registers in the child's region. */
void ts_thread_reset_after_fork(struct ts_thread *t)
{
	if (ts_proc.enabled)
		pthread_setspecific(ts_proc.key, NULL);
	memset(t, 0, sizeof(*t)); /* shadow = NULL: re-attached in the child's region */
}
