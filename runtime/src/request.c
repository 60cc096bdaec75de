/* request.c — the request API: begin/end on the service's hot path.
 *
 * Unsampled requests touch one thread-local counter (begin) and one
 * thread-local flag (end) and return. Everything else is out of line:
 *
 *   begin, countdown expired (request_begin_slow):
 *     first call on the thread -> claim a slot, seed the sampler;
 *     draw the next countdown (reads the agent's rate override);
 *     no agent attached -> record nothing (nobody would drain the ring);
 *     else: clock, kcounters snapshot, publish cur_* in the slot.
 *   end of the sampled request (request_end_slow):
 *     clock, kcounters snapshot, write the difference as a
 *     ts_request_record into the thread's ring, release-store ring_head.
 *
 * No locks, no allocation, no syscalls on either path (clock_gettime and
 * sched_getcpu are vDSO/rseq reads), except a bpf()+mmap at most every
 * 100 ms while an attached agent's kcounters map cannot be opened, and one
 * futex wake when a ring reaches TS_RING_WAKE_FILL while the agent sleeps
 * (at most once per agent sleep; see ts_wake_agent).
 */
#define _GNU_SOURCE
#include <errno.h>
#include <limits.h>
#include <linux/futex.h>
#include <sched.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "internal.h"
#include "tailscope/tailscope.h"

/* A ring reached TS_RING_WAKE_FILL: wake the agent if it sleeps on the
 * header's drain futex (ABI 5). Dekker with the agent, which sets
 * drain_waiting, fences, then looks at every ring's fill before it sleeps:
 * the fence here orders the caller's ring_head store before the load of
 * drain_waiting, so one of the two sees the other. Only one thread wins the
 * exchange, so a sleep costs at most one wake syscall. errno is the
 * application's: kept. Also called by a thread that exits with records
 * in its ring (slot.c), so its slot is drained and free again soon. A
 * winner descheduled between the exchange and the wake delays the agent
 * until it runs again (bounded by the agent's own timeout, MARKER_WAIT). */
__attribute__((noinline)) void ts_wake_agent(void)
{
	struct ts_region_header *h = ts_proc.hdr;
	__atomic_thread_fence(__ATOMIC_SEQ_CST);
	if (!__atomic_load_n(&h->drain_waiting, __ATOMIC_RELAXED) ||
	    !__atomic_exchange_n(&h->drain_waiting, 0, __ATOMIC_ACQ_REL))
		return;
	__atomic_add_fetch(&h->drain_futex, 1, __ATOMIC_RELEASE);
	int e = errno;
	/* Not FUTEX_PRIVATE_FLAG: the agent maps the region from another process. */
	syscall(SYS_futex, &h->drain_futex, FUTEX_WAKE, INT_MAX, NULL, NULL, 0);
	errno = e;
}

/* Seqlock-publish the slot's cur_* for observers (gen odd while writing). */
static void slot_publish(struct ts_thread_slot *s, const struct ts_thread *t, uint32_t active)
{
	uint64_t g = s->gen;
	__atomic_store_n(&s->gen, g + 1, __ATOMIC_RELAXED);
	__atomic_thread_fence(__ATOMIC_RELEASE);
	s->cur_request_id = t->cur_id;
	s->cur_start_ns = t->start_ns;
	s->cur_kind = t->kind;
	s->cur_active = active;
	__atomic_store_n(&s->gen, g + 2, __ATOMIC_RELEASE);
}

static __attribute__((noinline)) void request_begin_sampled(struct ts_thread *t, uint64_t id,
                                                            int kind)
{
	uint64_t now = ts_now_ns();
	uint64_t hb = __atomic_load_n(&ts_proc.hdr->agent_heartbeat_ns, __ATOMIC_RELAXED);
	if (hb && now > hb + TS_AGENT_STALE_NS)
		return; /* the agent stopped draining: gone, or stopped */
	t->snap_state = TS_SNAP_NONE;
	if (ts_kc_begin(t, now)) {
		/* BPF accounts this thread's irq, softirq and fault events only
		 * while sampled_refs is nonzero (abi.h). Only this thread writes
		 * its entry's field, and BPF reads it on this thread's CPU, so a
		 * plain store in program order is enough. */
		__atomic_store_n(&t->kc_map[t->kc_idx].sampled_refs, 1, __ATOMIC_RELAXED);
		t->snap_state = ts_kc_snapshot(t, now, &t->snap);
		/* No counters for this request (its switch-in unseen, or the
		 * entry went): no interrupt accounting either, and the end,
		 * which clears only after a snapshot, must not leave it set. */
		if (t->snap_state == TS_SNAP_NONE &&
		    __atomic_load_n(&t->kc_map[t->kc_idx].tid, __ATOMIC_RELAXED) == t->tid)
			__atomic_store_n(&t->kc_map[t->kc_idx].sampled_refs, 0, __ATOMIC_RELAXED);
	}
	t->cur_id = id;
	t->start_ns = now;
	t->kind = (kind > 0 && kind < TS_MAX_KINDS) ? (uint16_t)kind : 0;
	slot_publish(t->slot, t, 1);
	t->active = 1;
}

static __attribute__((noinline)) void request_begin_slow(uint64_t id, int kind)
{
	struct ts_thread *t = &ts_self;
	if (TS_UNLIKELY(t->state != TS_THREAD_READY)) {
		if (!ts_thread_init(t))
			return;
		if (--t->countdown > 0)
			return;
	}
	int sample = t->sample_at_zero;
	ts_sample_redraw(t);
	if (!sample)
		return;
	if (!__atomic_load_n(&ts_proc.hdr->agent_pid, __ATOMIC_RELAXED))
		return;
	/* Between burst windows the agent has detached the interrupt and fault
	 * programs: the counters would be incomplete. */
	uint32_t gate = __atomic_load_n(&ts_proc.hdr->burst_gate, __ATOMIC_ACQUIRE);
	if (gate & TS_BURST_CLOSED)
		return;
	t->gate = gate;
	request_begin_sampled(t, id, kind);
}

/* Fill r's counters with end - begin. Returns 0 if the entry went
 * backwards (reclaimed or reset under us): then the counters are junk. */
static int record_counters(struct ts_request_record *r, const struct ts_kc_snap *b,
                           const struct ts_kc_snap *e)
{
	if (e->oncpu_ns < b->oncpu_ns || e->runnable_ns < b->runnable_ns ||
	    e->blocked_ns < b->blocked_ns || e->irq_ns < b->irq_ns || e->softirq_ns < b->softirq_ns)
		return 0;
	r->oncpu_ns = e->oncpu_ns - b->oncpu_ns;
	r->runnable_ns = e->runnable_ns - b->runnable_ns;
	r->blocked_ns = e->blocked_ns - b->blocked_ns;
	r->irq_ns = e->irq_ns - b->irq_ns;
	r->softirq_ns = e->softirq_ns - b->softirq_ns;
	r->runnable_count = e->counts[0] - b->counts[0];
	r->blocked_count = e->counts[1] - b->counts[1];
	r->irq_count = e->counts[2] - b->counts[2];
	r->softirq_count = e->counts[3] - b->counts[3];
	r->fault_user_count = e->counts[4] - b->counts[4];
	r->fault_kernel_count = e->counts[5] - b->counts[5];
	r->migrations = e->counts[6] - b->counts[6];
	r->vol_switches = e->counts[7] - b->counts[7];
	r->invol_switches = e->counts[8] - b->counts[8];
	return 1;
}

static void record_clear_counters(struct ts_request_record *r)
{
	r->oncpu_ns = r->runnable_ns = r->blocked_ns = r->irq_ns = r->softirq_ns = 0;
	r->runnable_count = r->blocked_count = r->irq_count = r->softirq_count = 0;
	r->fault_user_count = r->fault_kernel_count = r->migrations = 0;
	r->vol_switches = r->invol_switches = 0;
}

static __attribute__((noinline)) void request_end_slow(uint64_t id)
{
	struct ts_thread *t = &ts_self;
	if (id != t->cur_id)
		return; /* not the open sampled request: ignore */
	t->active = 0;
	uint64_t now = ts_now_ns();
	struct ts_kc_snap end;
	int end_state = t->snap_state == TS_SNAP_NONE ? TS_SNAP_NONE : ts_kc_snapshot(t, now, &end);
	if (end_state != TS_SNAP_NONE) {
		/* The counters are whole only if the programs stayed attached
		 * until the snapshot: same burst window, not yet DETACHED (the
		 * agent sets it before it detaches; loads stay in order). */
		__atomic_thread_fence(__ATOMIC_ACQUIRE);
		uint32_t gate = __atomic_load_n(&ts_proc.hdr->burst_gate, __ATOMIC_RELAXED);
		if ((gate & ~(uint32_t)TS_BURST_CLOSED) != t->gate)
			end_state = TS_SNAP_NONE;
	}
	if (t->snap_state != TS_SNAP_NONE && t->kc_map && t->kc_idx &&
	    __atomic_load_n(&t->kc_map[t->kc_idx].tid, __ATOMIC_RELAXED) == t->tid)
		__atomic_store_n(&t->kc_map[t->kc_idx].sampled_refs, 0, __ATOMIC_RELAXED);
	struct ts_thread_slot *s = t->slot;
	slot_publish(s, t, 0);

	uint64_t head = s->ring_head;
	uint64_t tail = __atomic_load_n(&s->ring_tail, __ATOMIC_ACQUIRE);
	if (head - tail >= TS_RING_CAPACITY) {
		__atomic_store_n(&s->dropped_ring_full, s->dropped_ring_full + 1, __ATOMIC_RELAXED);
		return;
	}
	struct ts_request_record *r = &s->ring[head & (TS_RING_CAPACITY - 1)];
	uint16_t flags = TS_REC_SAMPLED;
	if (end_state != TS_SNAP_NONE && record_counters(r, &t->snap, &end)) {
		flags |= TS_REC_COUNTERS;
		if (end_state == TS_SNAP_TORN || t->snap_state == TS_SNAP_TORN)
			flags |= TS_REC_TORN;
	} else {
		record_clear_counters(r);
	}
	r->request_id = id;
	r->start_ns = t->start_ns;
	r->latency_ns = now - t->start_ns;
	r->tid = t->tid;
	r->kind = t->kind;
	r->flags = flags;
	r->cpu = (uint32_t)sched_getcpu();
	__atomic_store_n(&s->ring_head, head + 1, __ATOMIC_RELEASE);
	/* Only at the crossing: the fill seen here rises by one per record
	 * (a drain only lowers it), so no ring passes the mark unseen, and a
	 * ring kept full by a stopped agent costs no fence per record. */
	if (TS_UNLIKELY(head + 1 - tail == TS_RING_WAKE_FILL))
		ts_wake_agent();
}

/* Hot path, unsampled: 7 instructions on x86-64 gcc -O2 (TLS offset, load,
 * sub, store, test, jle, ret). */
void tailscope_request_begin_kind(uint64_t id, int kind)
{
	if (TS_LIKELY(--ts_self.countdown > 0))
		return;
	request_begin_slow(id, kind);
}

/* Same as begin_kind(id, 0), without the extra call. */
void tailscope_request_begin(uint64_t id)
{
	if (TS_LIKELY(--ts_self.countdown > 0))
		return;
	request_begin_slow(id, 0);
}

/* Hot path, no sampled request open: 5 instructions (TLS offset, load,
 * test, jne, ret). */
void tailscope_request_end(uint64_t id)
{
	if (TS_LIKELY(!ts_self.active))
		return;
	request_end_slow(id);
}

/* The overall rate. While the agent samples in burst windows the runtime
 * draws at the in-window rate; the header then also carries the rate the
 * windows add up to, which is what a caller scaling counts needs. */
uint32_t tailscope_sample_ppm(void)
{
	if (!ts_process_ready())
		return 0;
	uint32_t ppm = ts_current_ppm();
	struct ts_region_header *h = ts_proc.hdr;
	if (h && __atomic_load_n(&h->agent_pid, __ATOMIC_RELAXED)) {
		uint32_t eff = __atomic_load_n(&h->sample_ppm_effective, __ATOMIC_RELAXED);
		if (eff && eff < ppm)
			return eff;
	}
	return ppm;
}
