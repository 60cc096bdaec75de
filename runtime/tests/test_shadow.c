/* test_shadow.c — the LDB half of libtailscope: shadow stacks, the lock
 * shim and request events. Built with -finstrument-functions (the code
 * under test); the checking code is marked no_instrument_function.
 *
 * Like test_runtime.c it plays the agent: it maps its own region, reads
 * its thread's slot, sets ldb_flags and agent_pid, and drains event rings.
 */
#define _GNU_SOURCE
#include <fcntl.h>
#include <pthread.h>
#include <setjmp.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

#include "tailscope/abi.h"
#include "tailscope/tailscope.h"

#define NOINST __attribute__((no_instrument_function))
#define NOINLINE __attribute__((noinline))

static int passed, failed;
#define CHECK(cond)                                                                                \
	do {                                                                                       \
		if (cond)                                                                          \
			passed++;                                                                  \
		else {                                                                             \
			failed++;                                                                  \
			fprintf(stderr, "FAIL %s:%d: %s\n", __FILE__, __LINE__, #cond);            \
		}                                                                                  \
	} while (0)

static struct ts_region_header *hdr;
static struct ts_thread_slot *slots;

static NOINST uint64_t now_ns(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static NOINST struct ts_thread_slot *my_slot(void)
{
	uint32_t tid = (uint32_t)gettid();
	for (int i = 0; i < TS_MAX_SLOTS; i++)
		if (slots[i].tid == tid && slots[i].state == TS_SLOT_LIVE)
			return &slots[i];
	return NULL;
}

static NOINST struct ts_shadow_stack *me(void)
{
	struct ts_thread_slot *s = my_slot();
	return s ? &s->shadow : NULL;
}

/* ---- depth, recursion, loops ----------------------------------------- */

static uint32_t seen_depth;
static uint64_t seen_ids[8];

static NOINLINE void leaf3(void)
{
	seen_depth = me()->depth;
}
static NOINLINE void mid2(void)
{
	leaf3();
}
static NOINLINE void top1(void)
{
	mid2();
}

static NOINLINE int rec(int n)
{
	if (n == 0) {
		seen_depth = me()->depth;
		return 0;
	}
	return rec(n - 1) + 1;
}

static NOINLINE void record_id(int i)
{
	struct ts_shadow_stack *s = me();
	seen_ids[i] = s->frames[s->depth - 1].id;
}

static NOINST void test_depth(void)
{
	struct ts_shadow_stack *s = me();
	CHECK(s != NULL);
	if (!s)
		exit(1);
	CHECK(hdr->features & TS_FEAT_FN_HOOKS);
	uint32_t base = s->depth; /* main() and the test function are instrumented? no: NOINST */
	top1();
	CHECK(seen_depth == base + 3);
	CHECK(s->depth == base);
	CHECK(s->frames[base].fn == (uint64_t)(uintptr_t)top1);
	CHECK(s->frames[base + 2].fn == (uint64_t)(uintptr_t)leaf3);
	rec(10);
	CHECK(seen_depth == base + 11);
	CHECK(s->depth == base);
	for (int i = 0; i < 4; i++)
		record_id(i); /* one call site, four calls */
	int distinct = 1;
	for (int i = 1; i < 4; i++)
		distinct &= seen_ids[i] > seen_ids[i - 1];
	CHECK(distinct);
	CHECK(s->gen % 2 == 0);
}

/* ---- truncation -------------------------------------------------------- */

static NOINST void test_truncation(void)
{
	struct ts_shadow_stack *s = me();
	uint32_t base = s->depth;
	uint64_t before = s->truncated;
	uint64_t f0 = base ? s->frames[base - 1].fn : 0;
	rec(200);
	CHECK(seen_depth == base + 201);
	CHECK(s->depth == base);
	CHECK(s->truncated - before == base + 201 - TS_SHADOW_DEPTH);
	CHECK(base == 0 || s->frames[base - 1].fn == f0);
	CHECK(s->resyncs == 0);
}

/* ---- longjmp ------------------------------------------------------------ */

static jmp_buf jb;
static volatile int jump_sink;
static NOINLINE void jump_deep(int n)
{
	if (n <= 0)
		longjmp(jb, 1);
	if (n < 100)
		jump_deep(n - 1);
	jump_sink++;
}
static NOINLINE void after_jump(void)
{
	seen_depth = me()->depth;
}
static NOINLINE void jumper(void)
{
	uint32_t at = me()->depth; /* jumper's own frame is on top */
	if (setjmp(jb) == 0)
		jump_deep(5);
	CHECK(me()->depth == at + 6); /* the skipped frames are still there */
	after_jump();                 /* its entry drops them */
	CHECK(seen_depth == at + 1);
}

static NOINST void test_longjmp(void)
{
	struct ts_shadow_stack *s = me();
	uint32_t base = s->depth;
	uint64_t r0 = s->resyncs;
	jumper();
	CHECK(s->depth == base);
	CHECK(s->resyncs - r0 == 6);
}

/* ---- signals ------------------------------------------------------------ */

static volatile uint64_t handler_calls, handler_skipped;
static volatile uint32_t handler_bad;
static NOINLINE void in_handler(void)
{
	handler_calls++;
	struct ts_shadow_stack *s = me();
	if (s->gen & 1)
		handler_skipped++; /* landed in a push: this call and on_alarm's were skipped */
	/* Interrupting a hook, the handler's calls are skipped: then depth is
	 * the interrupted thread's. Otherwise our frame is on top. */
	if (s->depth >= 1 && s->depth <= TS_SHADOW_DEPTH && !(s->gen & 1) &&
	    s->frames[s->depth - 1].fn != (uint64_t)(uintptr_t)in_handler)
		handler_bad++;
}
static NOINLINE void on_alarm(int sig)
{
	(void)sig;
	in_handler();
}
static NOINLINE uint64_t busy_leaf(uint64_t x)
{
	return x * 31 + 7;
}

static NOINST void test_signals(void)
{
	struct ts_shadow_stack *s = me();
	uint32_t base = s->depth;
	uint64_t r0 = s->resyncs, k0 = s->skipped;
	struct sigaction sa = {.sa_handler = on_alarm};
	sigaction(SIGALRM, &sa, NULL);
	struct itimerval it = {{0, 50}, {0, 50}};
	setitimer(ITIMER_REAL, &it, NULL);
	uint64_t acc = 0, end = now_ns() + 300000000ull;
	while (now_ns() < end)
		for (int i = 0; i < 1000; i++)
			acc += busy_leaf((uint64_t)i);
	struct itimerval off = {{0, 0}, {0, 0}};
	setitimer(ITIMER_REAL, &off, NULL);
	signal(SIGALRM, SIG_DFL);
	CHECK(acc != 0);
	CHECK(handler_calls > 100);
	CHECK(s->depth == base);
	CHECK(s->resyncs == r0);
	CHECK(s->gen % 2 == 0);
	if (handler_bad)
		fprintf(stderr, "handler_bad %u of %llu\n", handler_bad,
		        (unsigned long long)handler_calls);
	CHECK(handler_bad == 0);
	/* Every skipped push is counted: on_alarm's and in_handler's per skip. */
	if (s->skipped - k0 != 2 * handler_skipped)
		fprintf(stderr, "skipped %llu, handlers skipped %llu\n",
		        (unsigned long long)(s->skipped - k0), (unsigned long long)handler_skipped);
	CHECK(s->skipped - k0 == 2 * handler_skipped);
	printf("signals: %llu handler calls, %llu landed in a push (skipped)\n",
	       (unsigned long long)handler_calls, (unsigned long long)handler_skipped);
}

/* ---- lock shim ---------------------------------------------------------- */

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static volatile int holder_in;

static NOINST void *holder(void *arg)
{
	(void)arg;
	pthread_mutex_lock(&mu);
	holder_in = 1;
	/* Hold until the other thread waits in the kernel (glibc marks a
	 * contended mutex 2), then 20 ms more: a waiter preempted on a loaded
	 * machine still waits the 20 ms the tests expect. */
	for (int i = 0; i < 50000 && __atomic_load_n(&mu.__data.__lock, __ATOMIC_ACQUIRE) != 2; i++)
		usleep(100);
	usleep(20000);
	pthread_mutex_unlock(&mu);
	return NULL;
}

static NOINST int drain_events(struct ts_thread_slot *s, struct ts_event *out, int max)
{
	uint64_t head = __atomic_load_n(&s->ev_head, __ATOMIC_ACQUIRE);
	int n = 0;
	for (uint64_t i = s->ev_tail; i < head && n < max; i++)
		out[n++] = s->events[i & (TS_EVENT_RING_CAPACITY - 1)];
	__atomic_store_n(&s->ev_tail, head, __ATOMIC_RELEASE);
	return n;
}

static NOINST struct ts_thread_slot *slot_of(uint32_t tid)
{
	for (int i = 0; i < TS_MAX_SLOTS; i++)
		if (slots[i].tid == tid)
			return &slots[i];
	return NULL;
}

static uint32_t holder_tid;
static NOINST void *holder_wrap(void *a)
{
	holder_tid = (uint32_t)gettid();
	return holder(a);
}

/* Starts the 20 ms holder and returns once it holds the mutex. */
static NOINST pthread_t start_holder(void)
{
	pthread_t th;
	holder_in = 0;
	pthread_create(&th, NULL, holder_wrap, NULL);
	while (!holder_in)
		usleep(100);
	return th;
}

static NOINST void test_locks(void)
{
	CHECK(hdr->features & TS_FEAT_LOCK_SHIM);
	struct ts_thread_slot *s = my_slot();
	struct ts_event ev[64];
	drain_events(s, ev, 64);
	/* Not recording: nothing. */
	pthread_mutex_lock(&mu);
	usleep(2000);
	pthread_mutex_unlock(&mu);
	CHECK(drain_events(s, ev, 64) == 0);

	hdr->agent_pid = 1;
	hdr->ldb_flags = TS_LDB_LOCKS | TS_LDB_REQUESTS;
	/* Short holds are not logged; a hold that an interrupt or a
	 * preemption lengthened past 1 us is, so allow a few of the 100. */
	for (int i = 0; i < 100; i++) {
		pthread_mutex_lock(&mu);
		pthread_mutex_unlock(&mu);
	}
	CHECK(drain_events(s, ev, 64) <= 3 * 3);
	/* A 20 ms holder and a waiter. */
	pthread_t th = start_holder();
	uint64_t t0 = now_ns();
	pthread_mutex_lock(&mu);
	uint64_t t1 = now_ns();
	pthread_mutex_unlock(&mu);
	pthread_join(th, NULL);
	int n = drain_events(s, ev, 64);
	CHECK(n == 3);
	if (n == 3) {
		CHECK(ev[0].type == TS_EV_MUTEX_WAIT && ev[1].type == TS_EV_MUTEX_LOCK &&
		      ev[2].type == TS_EV_MUTEX_UNLOCK);
		CHECK(ev[0].object == (uint64_t)(uintptr_t)&mu);
		/* (2 us of slack: the shim may have calibrated its TSC scale
		 * by now, see test_locks_tsc) */
		int ok = ev[0].ts_ns + 2000 >= t0 && ev[1].ts_ns <= t1 + 2000 &&
		         ev[1].ts_ns - ev[0].ts_ns > 5000000;
		CHECK(ok);
		if (!ok)
			fprintf(stderr,
			        "lock stamps: wait %+lld ns after t0, lock %+lld after t1, waited "
			        "%lld ns\n",
			        (long long)(ev[0].ts_ns - t0), (long long)(ev[1].ts_ns - t1),
			        (long long)(ev[1].ts_ns - ev[0].ts_ns));
		CHECK(ev[0].tid == (uint32_t)gettid());
	}
	struct ts_thread_slot *hs = slot_of(holder_tid);
	CHECK(hs != NULL);
	if (hs) {
		n = drain_events(hs, ev, 64);
		CHECK(n == 2);
		CHECK(n == 2 && ev[0].type == TS_EV_MUTEX_LOCK &&
		      ev[1].type == TS_EV_MUTEX_UNLOCK && ev[1].ts_ns - ev[0].ts_ns >= 20000000);
	}
	/* trylock + a condition wait: the hold before the wait is logged. */
	pthread_cond_t cv = PTHREAD_COND_INITIALIZER;
	CHECK(pthread_mutex_trylock(&mu) == 0);
	usleep(2000);
	struct timespec ts;
	clock_gettime(CLOCK_REALTIME, &ts);
	ts.tv_nsec += 1000000;
	if (ts.tv_nsec >= 1000000000) {
		ts.tv_sec++;
		ts.tv_nsec -= 1000000000;
	}
	pthread_cond_timedwait(&cv, &mu, &ts);
	pthread_mutex_unlock(&mu);
	n = drain_events(s, ev, 64);
	CHECK(n >= 2 && ev[0].type == TS_EV_MUTEX_LOCK && ev[1].type == TS_EV_MUTEX_UNLOCK &&
	      ev[1].ts_ns - ev[0].ts_ns >= 2000000);

	/* Request hand-off events. */
	int queue;
	tailscope_req_start(42, NULL);
	tailscope_req_block(42, &queue);
	tailscope_req_start(42, &queue);
	tailscope_req_end(42);
	tailscope_req_end_all();
	n = drain_events(s, ev, 64);
	CHECK(n == 5);
	CHECK(n == 5 && ev[0].type == TS_EV_REQ_START && ev[1].type == TS_EV_REQ_BLOCK &&
	      ev[1].arg == (uint64_t)(uintptr_t)&queue && ev[3].type == TS_EV_REQ_END &&
	      ev[3].object == 42 && ev[4].type == TS_EV_REQ_END_ALL);
	hdr->ldb_flags = 0;
	hdr->agent_pid = 0;
	tailscope_req_start(43, NULL);
	CHECK(drain_events(s, ev, 64) == 0);
}

/* After 2 ms of locking the shim has measured its TSC scale (where the
 * clocksource is the TSC): stamps are then TSC ticks, converted to
 * CLOCK_MONOTONIC ns when an episode is logged. The same bounds hold, to
 * within 2 us of conversion error. */
static NOINST void test_locks_tsc(void)
{
	struct ts_thread_slot *s = my_slot();
	struct ts_event ev[64];
	hdr->agent_pid = 1;
	hdr->ldb_flags = TS_LDB_LOCKS;
	for (uint64_t until = now_ns() + 5000000; now_ns() < until;) {
		pthread_mutex_lock(&mu);
		pthread_mutex_unlock(&mu);
	}
	drain_events(s, ev, 64); /* (a hold that an interrupt lengthened past 1 us is logged) */
	pthread_t th = start_holder();
	uint64_t t0 = now_ns();
	pthread_mutex_lock(&mu);
	uint64_t t1 = now_ns();
	usleep(3000);
	uint64_t t2 = now_ns();
	pthread_mutex_unlock(&mu);
	uint64_t t3 = now_ns();
	pthread_join(th, NULL);
	int n = drain_events(s, ev, 64);
	CHECK(n == 3);
	if (n == 3) {
		CHECK(ev[0].type == TS_EV_MUTEX_WAIT && ev[2].type == TS_EV_MUTEX_UNLOCK);
		CHECK(ev[0].ts_ns + 2000 >= t0 && ev[0].ts_ns <= t1 + 2000);
		CHECK(ev[1].ts_ns + 2000 >= t0 && ev[1].ts_ns <= t1 + 2000);
		CHECK(ev[1].ts_ns - ev[0].ts_ns > 5000000);
		CHECK(ev[2].ts_ns + 2000 >= t2 && ev[2].ts_ns <= t3 + 2000);
		CHECK(ev[2].ts_ns - ev[1].ts_ns >= 3000000);
		if (!(ev[0].ts_ns + 2000 >= t0 && ev[2].ts_ns <= t3 + 2000))
			fprintf(stderr,
			        "tsc stamps: wait %+lld ns after t0, unlock %+lld ns after t3\n",
			        (long long)(ev[0].ts_ns - t0), (long long)(ev[2].ts_ns - t3));
	}
	struct ts_thread_slot *hs = slot_of(holder_tid);
	CHECK(hs != NULL);
	if (hs) {
		n = drain_events(hs, ev, 64);
		CHECK(n == 2 && ev[0].type == TS_EV_MUTEX_LOCK &&
		      ev[1].type == TS_EV_MUTEX_UNLOCK && ev[1].ts_ns - ev[0].ts_ns >= 20000000 &&
		      ev[0].ts_ns < t0 + 2000);
	}
	hdr->ldb_flags = 0;
	hdr->agent_pid = 0;
}

/* For a hold that must stay under the threshold: whether to try again
 * because the machine stretched it past (said on stderr; at most 5 times,
 * then a failed check). */
static NOINST int stretched_again(const char *what, uint64_t held, int tries)
{
	fprintf(stderr, "threshold_nested: %s took %llu ns; again\n", what,
	        (unsigned long long)held);
	CHECK(tries < 5);
	return tries < 5;
}

/* The agent's threshold (header mutex_thresh_ns) decides what is logged,
 * and nested holds are followed whichever order they are released in: the
 * unlock path compares its stamp with a deadline set when the mutex was
 * acquired (the latest lock's entry, or another one's after a search). */
static NOINST void test_locks_threshold_nested(void)
{
	static pthread_mutex_t ma = PTHREAD_MUTEX_INITIALIZER, mb = PTHREAD_MUTEX_INITIALIZER;
	struct ts_thread_slot *s = my_slot();
	struct ts_event ev[64];
	hdr->agent_pid = 1;
	hdr->ldb_flags = TS_LDB_LOCKS;
	while (drain_events(s, ev, 64) > 0)
		;
	/* 20 ms: a 3 ms hold is under it, a 40 ms one over it. */
	hdr->mutex_thresh_ns = 20000000;
	/* (a loaded machine can stretch the 3 ms sleep past 20 ms: the hold is
	 * bracketed, and a try whose hold really exceeded the threshold is retried) */
	for (int tries = 0;; tries++) {
		uint64_t h0 = now_ns();
		pthread_mutex_lock(&ma);
		usleep(3000);
		pthread_mutex_unlock(&ma);
		uint64_t held = now_ns() - h0;
		int got = drain_events(s, ev, 64);
		if (held < 20000000) {
			CHECK(got == 0);
			break;
		}
		if (!stretched_again("a 3 ms hold", held, tries))
			break;
	}
	pthread_mutex_lock(&ma);
	usleep(40000);
	pthread_mutex_unlock(&ma);
	int n = drain_events(s, ev, 64);
	CHECK(n == 2 && ev[0].type == TS_EV_MUTEX_LOCK && ev[1].type == TS_EV_MUTEX_UNLOCK &&
	      ev[0].object == (uint64_t)(uintptr_t)&ma && ev[1].ts_ns - ev[0].ts_ns >= 40000000);
	/* Back to 1 ms. Nested, released out of order: both logged, each
	 * with its own mutex and hold. */
	hdr->mutex_thresh_ns = 1000000;
	pthread_mutex_lock(&ma);
	usleep(3000);
	CHECK(pthread_mutex_trylock(&mb) == 0);
	usleep(3000);
	pthread_mutex_unlock(&ma); /* not the latest: found by the search */
	usleep(3000);
	pthread_mutex_unlock(&mb);
	n = drain_events(s, ev, 64);
	CHECK(n == 4);
	if (n == 4) {
		CHECK(ev[0].type == TS_EV_MUTEX_LOCK && ev[0].object == (uint64_t)(uintptr_t)&ma &&
		      ev[1].type == TS_EV_MUTEX_UNLOCK &&
		      ev[1].object == (uint64_t)(uintptr_t)&ma &&
		      ev[1].ts_ns - ev[0].ts_ns >= 6000000);
		CHECK(ev[2].type == TS_EV_MUTEX_LOCK && ev[2].object == (uint64_t)(uintptr_t)&mb &&
		      ev[3].type == TS_EV_MUTEX_UNLOCK &&
		      ev[3].object == (uint64_t)(uintptr_t)&mb &&
		      ev[3].ts_ns - ev[2].ts_ns >= 6000000 && ev[2].ts_ns > ev[0].ts_ns);
	}
	/* Nested in order, the inner hold short: only the outer one (retried
	 * when a preemption stretched the inner hold past the 1 ms threshold). */
	for (int tries = 0;; tries++) {
		pthread_mutex_lock(&ma);
		uint64_t h0 = now_ns();
		pthread_mutex_lock(&mb);
		pthread_mutex_unlock(&mb);
		uint64_t held = now_ns() - h0;
		usleep(3000);
		pthread_mutex_unlock(&ma);
		n = drain_events(s, ev, 64);
		if (held < 1000000) {
			CHECK(n == 2 && ev[0].object == (uint64_t)(uintptr_t)&ma &&
			      ev[1].ts_ns - ev[0].ts_ns >= 3000000);
			break;
		}
		if (!stretched_again("an empty inner hold", held, tries))
			break;
	}
	hdr->mutex_thresh_ns = 0;
	hdr->ldb_flags = 0;
	hdr->agent_pid = 0;
}

/* An agent killed with SIGKILL leaves ldb_flags set. Once its event ring
 * is full and its heartbeat stale, events stop (no more drops counted,
 * no stamps) until another agent's heartbeat appears. */
static NOINST void test_dead_agent_stops_events(void)
{
	struct ts_thread_slot *s = my_slot();
	struct ts_event ev[64];
	while (drain_events(s, ev, 64) > 0)
		;
	hdr->agent_pid = 1;
	hdr->ldb_flags = TS_LDB_LOCKS | TS_LDB_REQUESTS;
	hdr->agent_heartbeat_ns = now_ns() - 4000000000ull; /* stale: TS_AGENT_STALE_NS is 3 s */
	for (int i = 0; i < TS_EVENT_RING_CAPACITY + 1; i++)
		tailscope_req_start(100 + (uint64_t)i,
		                    NULL); /* fills the ring; the last one drops */
	uint64_t dropped = s->ev_dropped;
	for (int i = 0; i < 10; i++)
		tailscope_req_start(7, NULL);
	pthread_mutex_lock(&mu);
	usleep(2000); /* a hold the shim would log */
	pthread_mutex_unlock(&mu);
	CHECK(s->ev_dropped == dropped); /* stopped: not even attempted */
	/* A live agent (a new heartbeat) drains: events again. */
	hdr->agent_heartbeat_ns = now_ns();
	while (drain_events(s, ev, 64) > 0)
		;
	tailscope_req_start(8, NULL);
	int n = drain_events(s, ev, 64);
	CHECK(n == 1 && ev[0].object == 8);
	hdr->ldb_flags = 0;
	hdr->agent_pid = 0;
	hdr->agent_heartbeat_ns = 0;
}

/* ---- thread churn -------------------------------------------------------- */

static NOINLINE void *churn(void *arg)
{
	(void)arg;
	top1();
	return NULL;
}

static NOINST void test_churn(void)
{
	uint64_t exhausted = hdr->slots_exhausted;
	for (int i = 0; i < 1000; i += 8) {
		pthread_t th[8];
		for (int j = 0; j < 8; j++)
			pthread_create(&th[j], NULL, churn, NULL);
		for (int j = 0; j < 8; j++)
			pthread_join(th[j], NULL);
	}
	CHECK(hdr->slots_exhausted == exhausted);
	CHECK(hdr->slots_used <= TS_MAX_SLOTS);
	int live = 0;
	for (int i = 0; i < TS_MAX_SLOTS; i++)
		live += slots[i].state == TS_SLOT_LIVE;
	CHECK(live < 8);
}

int main(void)
{
	setvbuf(stdout, NULL, _IONBF, 0);
	CHECK(tailscope_enabled());
	char path[64];
	snprintf(path, sizeof(path), TS_REGION_PATH_FMT, getpid());
	int fd = open(path, O_RDWR);
	struct stat st;
	if (fd < 0 || fstat(fd, &st) != 0)
		return 1;
	hdr = mmap(NULL, (size_t)st.st_size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	close(fd);
	if (hdr == MAP_FAILED)
		return 1;
	slots = (struct ts_thread_slot *)(hdr + 1);
	CHECK(hdr->shadow_depth == TS_SHADOW_DEPTH);
	CHECK(hdr->event_ring_capacity == TS_EVENT_RING_CAPACITY);
	top1(); /* attach this thread */
	test_depth();
	test_truncation();
	test_longjmp();
	test_signals();
	test_locks();
	test_locks_tsc();
	test_locks_threshold_nested();
	test_dead_agent_stops_events();
	test_churn();
	printf("shadow: %d passed, %d failed\n", passed, failed);
	return failed != 0;
}
