/* events.c — the per-thread event ring (ABI 2) and the request hand-off API.
 *
 * Lock events (lockshim.c) and request events (below) go into the thread's
 * event ring in its slot: written at ev_head, published by a release store
 * of ev_head, consumed by the agent, which advances ev_tail. A full ring
 * drops the event and counts it in ev_dropped. Nothing is written unless an
 * agent is attached and recording --functions (header.ldb_flags): nobody
 * would drain the ring otherwise.
 *
 * Requests across threads (LDB §3.3.3): a thread that starts (or resumes)
 * work on request `id` calls tailscope_req_start(id, queue); one that parks
 * it in a software queue calls tailscope_req_block(id, queue); the thread
 * that finishes it calls tailscope_req_end(id), or tailscope_req_end_all()
 * to end every request it holds. The analysis follows a request through
 * every thread that had it between a START and a BLOCK or END.
 */
#define _GNU_SOURCE
#include <time.h>

#include "internal.h"
#include "tailscope/tailscope.h"

#define NOINST __attribute__((no_instrument_function))

static NOINST uint64_t now_ns(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

NOINST uint64_t ts_mutex_thresh_ns(void)
{
	uint64_t v =
	    ts_proc.hdr ? __atomic_load_n(&ts_proc.hdr->mutex_thresh_ns, __ATOMIC_RELAXED) : 0;
	return v ? v : TS_MUTEX_THRESH_NS;
}

/* Push n (1..3) events, all or none. Returns 1 if written. */
NOINST int ts_event_push3(struct ts_thread *t, const struct ts_event *ev, int n)
{
	if (t->state != TS_THREAD_READY && !ts_thread_init(t))
		return 0;
	struct ts_thread_slot *s = t->slot;
	uint64_t head = s->ev_head;
	uint64_t tail = __atomic_load_n(&s->ev_tail, __ATOMIC_ACQUIRE);
	if (head - tail > (uint64_t)(TS_EVENT_RING_CAPACITY - n)) {
		__atomic_store_n(&s->ev_dropped, s->ev_dropped + (uint64_t)n, __ATOMIC_RELAXED);
		/* Full: is anybody draining? An agent killed with SIGKILL leaves
		 * ldb_flags set; its stale heartbeat stops the events (and the
		 * lock shim's stamps) until another agent's heartbeat appears. */
		uint64_t hb = __atomic_load_n(&ts_proc.hdr->agent_heartbeat_ns, __ATOMIC_RELAXED);
		if (hb && ts_now_ns() > hb + TS_AGENT_STALE_NS)
			__atomic_store_n(&ts_proc.ldb_dead_hb, hb, __ATOMIC_RELAXED);
		return 0;
	}
	for (int i = 0; i < n; i++) {
		struct ts_event *e =
		    &s->events[(head + (uint64_t)i) & (TS_EVENT_RING_CAPACITY - 1)];
		*e = ev[i];
		e->tid = t->tid;
	}
	__atomic_store_n(&s->ev_head, head + (uint64_t)n, __ATOMIC_RELEASE);
	return 1;
}

static NOINST void req_event(uint32_t type, uint64_t id, const void *queue)
{
	if (!ts_process_ready())
		return;
	if (!ts_ldb_on(ts_proc.hdr, TS_LDB_REQUESTS))
		return;
	struct ts_event e = {
	    .ts_ns = now_ns(), .object = id, .arg = (uint64_t)(uintptr_t)queue, .type = type};
	ts_event_push3(&ts_self, &e, 1);
}

NOINST void tailscope_req_start(uint64_t id, const void *queue)
{
	req_event(TS_EV_REQ_START, id, queue);
}
NOINST void tailscope_req_block(uint64_t id, const void *queue)
{
	req_event(TS_EV_REQ_BLOCK, id, queue);
}
NOINST void tailscope_req_end(uint64_t id)
{
	req_event(TS_EV_REQ_END, id, NULL);
}
NOINST void tailscope_req_end_all(void)
{
	req_event(TS_EV_REQ_END_ALL, 0, NULL);
}
