/* test_runtime.c — tests for libtailscope, run by `make -C runtime test`.
 *
 * The test plays the agent: it maps this process's region the way the
 * agent does, sets header.agent_pid to fake an attachment, sets
 * sample_ppm_agent to choose rates, and drains rings by advancing
 * ring_tail. It re-executes itself with TAILSCOPE_SAMPLE=0 so that the
 * runtime's own rate is 0 and every rate used comes from the override.
 * Tests that need a real kcounters map (an agent running) are skipped.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <linux/futex.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "tailscope/tailscope.h"
#include "tailscope/abi.h"
#include "fake_kc.h"

/* internal, linked from the static library */
uint32_t ts_parse_sample(const char *s, uint32_t dflt);
double ts_ln(double x);

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

static struct ts_region_header *map_region(int pid)
{
	char path[64];
	snprintf(path, sizeof(path), TS_REGION_PATH_FMT, pid);
	int fd = open(path, O_RDWR);
	if (fd < 0)
		return NULL;
	struct stat st;
	fstat(fd, &st);
	void *p = mmap(NULL, st.st_size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	close(fd);
	return p == MAP_FAILED ? NULL : p;
}

static struct ts_thread_slot *slot_of(uint32_t tid)
{
	for (int i = 0; i < TS_MAX_SLOTS; i++)
		if (slots[i].tid == tid && slots[i].state == TS_SLOT_LIVE)
			return &slots[i];
	return NULL;
}

/* Drain one slot's ring; returns records consumed. */
static uint64_t drain(struct ts_thread_slot *s)
{
	uint64_t head = __atomic_load_n(&s->ring_head, __ATOMIC_ACQUIRE);
	uint64_t n = head - s->ring_tail;
	__atomic_store_n(&s->ring_tail, head, __ATOMIC_RELEASE);
	return n;
}

static void attach(uint32_t ppm)
{
	hdr->sample_ppm_agent = ppm;
	hdr->agent_pid = 1;
}

static void detach(void)
{
	hdr->agent_pid = 0;
	hdr->sample_ppm_agent = 0;
}

/* Run fn on a fresh thread (a fresh countdown drawn at the current rate). */
static void on_thread(void *(*fn)(void *), void *arg)
{
	pthread_t th;
	pthread_create(&th, NULL, fn, arg);
	pthread_join(th, NULL);
}

static void test_parse(void)
{
	CHECK(ts_parse_sample("0.01", 7) == 10000);
	CHECK(ts_parse_sample("1%", 7) == 10000);
	CHECK(ts_parse_sample("250ppm", 7) == 250);
	CHECK(ts_parse_sample("250", 7) == 250);
	CHECK(ts_parse_sample("1", 7) == 1000000);
	CHECK(ts_parse_sample("0", 7) == 0);
	CHECK(ts_parse_sample("100%", 7) == 1000000);
	CHECK(ts_parse_sample("abc", 7) == 7);
	CHECK(ts_parse_sample(NULL, 7) == 7);
	double worst = 0;
	for (double x = 1e-12; x < 1e6; x *= 1.37)
		worst = fmax(worst, fabs(ts_ln(x) - log(x)) / fmax(1e-300, fabs(log(x))));
	CHECK(worst < 1e-8);
	CHECK(fabs(ts_ln(1 - 1e-6) - log1p(-1e-6)) < 1e-14);
}

static void test_region_header(void)
{
	CHECK(tailscope_enabled());
	hdr = map_region(getpid());
	CHECK(hdr != NULL);
	if (!hdr)
		exit(1);
	slots = (struct ts_thread_slot *)(hdr + 1);
	CHECK(hdr->magic == TS_ABI_MAGIC);
	CHECK(hdr->abi_version == TS_ABI_VERSION);
	CHECK(hdr->header_size == sizeof(struct ts_region_header));
	CHECK(hdr->slot_size == sizeof(struct ts_thread_slot));
	CHECK(hdr->max_slots == TS_MAX_SLOTS);
	CHECK(hdr->ring_capacity == TS_RING_CAPACITY);
	CHECK(hdr->record_size == sizeof(struct ts_request_record));
	CHECK(hdr->pid == (uint32_t)getpid());
	CHECK(hdr->sample_ppm_runtime == 0);
	CHECK(hdr->created_ns != 0);
	CHECK(hdr->agent_pid == 0);
}

static void test_kinds(void)
{
	int get = tailscope_kind("GET"), set = tailscope_kind("SET");
	CHECK(get == 1 && set == 2);
	CHECK(tailscope_kind("GET") == 1);
	CHECK(strcmp(hdr->kinds[1], "GET") == 0 && hdr->kinds_count == 2);
	CHECK(tailscope_kind("") == 0);
	CHECK(tailscope_kind("a-very-long-kind-name-that-is-cut") == 3);
	CHECK(strlen(hdr->kinds[3]) == TS_KIND_NAME_LEN - 1);
}

struct rate_run {
	long n;
	uint64_t records;
	int bad;
};

static void *rate_thread(void *arg)
{
	struct rate_run *r = arg;
	tailscope_request_begin(0); /* registers the slot */
	tailscope_request_end(0);
	struct ts_thread_slot *s = slot_of(gettid());
	if (!s) {
		r->bad = 1;
		return NULL;
	}
	drain(s);
	for (long i = 1; i <= r->n; i++) {
		tailscope_request_begin_kind(i, 1);
		tailscope_request_end(i);
		uint64_t head = s->ring_head;
		if (head != s->ring_tail) {
			struct ts_request_record *rec =
			    &s->ring[(head - 1) & (TS_RING_CAPACITY - 1)];
			if (rec->request_id != (uint64_t)i || rec->kind != 1 ||
			    rec->tid != (uint32_t)gettid() || !(rec->flags & TS_REC_SAMPLED) ||
			    rec->cpu >= 1024 || rec->latency_ns > 1000000000ull)
				r->bad++;
			r->records += drain(s);
		}
	}
	if (s->cur_active)
		r->bad++;
	return NULL;
}

static uint64_t sampled_count(uint32_t ppm, long n, int *bad)
{
	struct rate_run r = {.n = n};
	attach(ppm);
	on_thread(rate_thread, &r);
	detach();
	*bad = r.bad;
	return r.records;
}

static void test_sampling(void)
{
	int bad;
	uint64_t got = sampled_count(10000, 1000000, &bad);
	double sigma = sqrt(1e6 * 0.01 * 0.99);
	printf("  1%% of 1e6: %llu sampled (expect 10000 +- %.0f)\n", (unsigned long long)got,
	       5 * sigma);
	CHECK(fabs((double)got - 10000) < 5 * sigma);
	CHECK(bad == 0);
	got = sampled_count(TS_PPM, 100000, &bad);
	CHECK(got == 100000 && bad == 0);
	got = sampled_count(0, 200000, &bad); /* no override: runtime rate 0 */
	CHECK(got == 0);
	got = sampled_count(100, 2000000, &bad);
	printf("  100 ppm of 2e6: %llu sampled (expect 200 +- 71)\n", (unsigned long long)got);
	CHECK(fabs((double)got - 200) < 5 * sqrt(200));
}

static void *no_agent_thread(void *arg)
{
	(void)arg;
	for (int i = 1; i <= 1000; i++) {
		tailscope_request_begin(i);
		tailscope_request_end(i);
	}
	struct ts_thread_slot *s = slot_of(gettid());
	CHECK(s && s->ring_head == s->ring_tail);
	return NULL;
}

/* Burst windows: the runtime draws at the in-window rate, and
 * tailscope_sample_ppm() reports the overall rate the agent published. */
static void test_effective_rate(void)
{
	attach(100000);
	CHECK(tailscope_sample_ppm() == 100000);
	hdr->sample_ppm_effective = 10000;
	CHECK(tailscope_sample_ppm() == 10000);
	/* never above the rate actually drawn at */
	hdr->sample_ppm_effective = 500000;
	CHECK(tailscope_sample_ppm() == 100000);
	/* a stale value without an agent is ignored (the override alone is
	 * what the runtime draws at) */
	hdr->sample_ppm_effective = 10000;
	hdr->agent_pid = 0;
	CHECK(tailscope_sample_ppm() == 100000);
	detach();
	hdr->sample_ppm_effective = 0;
}

/* An agent that stopped draining (killed with SIGKILL: it could not
 * detach) gets no more sampled requests once its heartbeat is stale. */
static void *heartbeat_thread(void *arg)
{
	int *made = arg;
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	uint64_t now = (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
	const uint64_t beats[3] = {0, now, now - TS_AGENT_STALE_NS - 1000000000ull};
	for (int i = 0; i < 3; i++) {
		hdr->agent_heartbeat_ns = beats[i];
		tailscope_request_begin(100 + i);
		tailscope_request_end(100 + i);
		struct ts_thread_slot *s = slot_of(gettid());
		made[i] = s ? (int)(s->ring_head - s->ring_tail) : -1;
		if (s)
			drain(s);
	}
	hdr->agent_heartbeat_ns = 0;
	return NULL;
}

static void test_agent_heartbeat(void)
{
	int made[3] = {-1, -1, -1};
	attach(TS_PPM);
	on_thread(heartbeat_thread, made);
	detach();
	CHECK(made[0] == 1); /* no heartbeat kept (tools, tests): sampled */
	CHECK(made[1] == 1); /* fresh */
	CHECK(made[2] == 0); /* stale: the agent is gone */
}

static void test_no_agent(void)
{
	hdr->sample_ppm_agent = TS_PPM;
	on_thread(no_agent_thread, NULL);
	hdr->sample_ppm_agent = 0;
}

static void *mismatch_thread(void *arg)
{
	(void)arg;
	tailscope_request_begin(0);
	tailscope_request_end(0);
	struct ts_thread_slot *s = slot_of(gettid());
	CHECK(s != NULL);
	if (!s)
		return NULL;
	drain(s);
	tailscope_request_end(42); /* no begin */
	CHECK(s->ring_head == s->ring_tail);
	tailscope_request_begin(1);
	CHECK(s->cur_active == 1 && s->cur_request_id == 1 && (s->gen & 1) == 0);
	tailscope_request_end(2); /* wrong id */
	CHECK(s->ring_head == s->ring_tail && s->cur_active == 1);
	tailscope_request_end(1);
	CHECK(s->ring_head == s->ring_tail + 1 && s->cur_active == 0);
	tailscope_request_end(1); /* twice */
	CHECK(s->ring_head == s->ring_tail + 1);
	drain(s);
	return NULL;
}

static void test_end_without_begin(void)
{
	attach(TS_PPM);
	on_thread(mismatch_thread, NULL);
	detach();
}

static void *overflow_thread(void *arg)
{
	(void)arg;
	const int n = TS_RING_CAPACITY + 88;
	for (int i = 1; i <= n; i++) {
		tailscope_request_begin(i);
		tailscope_request_end(i);
	}
	struct ts_thread_slot *s = slot_of(gettid());
	CHECK(s != NULL);
	if (!s)
		return NULL;
	CHECK(s->ring_head - s->ring_tail == TS_RING_CAPACITY);
	CHECK(s->dropped_ring_full == 88);
	CHECK(s->ring[0].request_id == 1 &&
	      s->ring[TS_RING_CAPACITY - 1].request_id == TS_RING_CAPACITY);
	drain(s);
	return NULL;
}

static void test_ring_overflow(void)
{
	attach(TS_PPM);
	on_thread(overflow_thread, NULL);
	detach();
}

/* ABI 5: the ring reaching TS_RING_WAKE_FILL wakes a waiting agent once. */
static void *wake_thread(void *arg)
{
	(void)arg;
	struct ts_region_header *h = hdr;
	uint32_t futex0 = h->drain_futex;
	h->drain_waiting = 1;
	int id = 1;
	for (; id < TS_RING_WAKE_FILL; id++) {
		tailscope_request_begin(id);
		tailscope_request_end(id);
	}
	CHECK(h->drain_waiting == 1 && h->drain_futex == futex0); /* below the mark: asleep */
	tailscope_request_begin(id);
	tailscope_request_end(id);
	CHECK(h->drain_waiting == 0 && h->drain_futex == futex0 + 1);
	id++;
	tailscope_request_begin(id);
	tailscope_request_end(id);
	CHECK(h->drain_futex == futex0 + 1); /* one wake per sleep */
	struct ts_thread_slot *s = slot_of(gettid());
	CHECK(s && s->ring_head - s->ring_tail == TS_RING_WAKE_FILL + 1);
	if (s)
		drain(s);
	return NULL;
}

static void test_ring_wakes_agent(void)
{
	attach(TS_PPM);
	on_thread(wake_thread, NULL);
	detach();
}

/* The real wake: an "agent" thread sleeps in FUTEX_WAIT on the test's own
 * mapping of the region (another mapping than the runtime's, as in
 * another process: only a shared futex reaches it) and a producer's
 * quarter-full ring wakes it long before its 5 s timeout. */
static volatile int waiter_ready;
static long waiter_rc;
static int waiter_errno;
static double waiter_s;

static double mono_s(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static volatile pid_t waiter_tid;

/* Whether thread `tid` of this process is blocked in futex(2) (x86-64
 * syscall 202), from /proc/self/task/TID/syscall. */
static int in_futex(pid_t tid)
{
	char path[64], buf[32] = {0};
	snprintf(path, sizeof(path), "/proc/self/task/%d/syscall", (int)tid);
	FILE *f = fopen(path, "r");
	if (!f)
		return 0;
	size_t n = fread(buf, 1, sizeof(buf) - 1, f);
	fclose(f);
	return n >= 4 && strncmp(buf, "202 ", 4) == 0;
}

static void *futex_waiter(void *arg)
{
	(void)arg;
	uint32_t seen = __atomic_load_n(&hdr->drain_futex, __ATOMIC_ACQUIRE);
	__atomic_store_n(&hdr->drain_waiting, 1, __ATOMIC_SEQ_CST);
	waiter_tid = gettid();
	waiter_ready = 1;
	struct timespec timeout = {5, 0};
	double t0 = mono_s();
	waiter_rc = syscall(SYS_futex, &hdr->drain_futex, FUTEX_WAIT, seen, &timeout, NULL, 0);
	waiter_errno = errno;
	waiter_s = mono_s() - t0;
	return NULL;
}

static void *fill_to_mark(void *arg)
{
	(void)arg;
	for (int id = 1; id <= TS_RING_WAKE_FILL; id++) {
		tailscope_request_begin(id);
		tailscope_request_end(id);
	}
	struct ts_thread_slot *s = slot_of(gettid());
	if (s)
		drain(s);
	return NULL;
}

static void test_futex_wakes_another_mapping(void)
{
	attach(TS_PPM);
	pthread_t w;
	waiter_ready = 0;
	pthread_create(&w, NULL, futex_waiter, NULL);
	while (!waiter_ready)
		usleep(1000);
	/* into FUTEX_WAIT (else the wake would find no waiter and the wait
	 * would see the word changed: EAGAIN); at most 5 s */
	for (int i = 0; i < 5000 && !in_futex(waiter_tid); i++)
		usleep(1000);
	on_thread(fill_to_mark, NULL);
	pthread_join(w, NULL);
	printf("  futex wake: returned %ld (errno %d) after %.3f s\n", waiter_rc, waiter_errno,
	       waiter_s);
	CHECK(waiter_rc == 0 && waiter_s < 2.0);
	detach();
}

/* A thread that exits with records in its ring wakes a waiting agent. */
static void *exit_with_records(void *arg)
{
	(void)arg;
	tailscope_request_begin(7);
	tailscope_request_end(7);
	return NULL;
}

static void test_exit_wakes_agent(void)
{
	attach(TS_PPM);
	uint32_t futex0 = hdr->drain_futex;
	hdr->drain_waiting = 1;
	on_thread(exit_with_records, NULL);
	CHECK(hdr->drain_waiting == 0 && hdr->drain_futex == futex0 + 1);
	for (uint32_t i = 0; i < hdr->slots_used; i++)
		if (slots[i].ring_head != slots[i].ring_tail)
			drain(&slots[i]);
	detach();
}

/* Producer/consumer: a fake agent thread drains concurrently. */
static volatile int producer_done;
static volatile uint32_t producer_tid;

static void *producer(void *arg)
{
	long n = (long)arg;
	producer_tid = gettid();
	tailscope_request_begin(0);
	tailscope_request_end(0);
	struct ts_thread_slot *s = slot_of(gettid());
	struct timespec t0, t1;
	clock_gettime(CLOCK_MONOTONIC, &t0);
	for (long i = 1; i <= n; i++) {
		tailscope_request_begin(i);
		tailscope_request_end(i);
		/* the first half waits for the consumer (10 s in all: a consumer
		 * preempted on a loaded machine must not turn the first half's
		 * records into drops, and a stuck one fails the test fast); the
		 * second half runs free and overflows */
		if (i < n / 2 && (i & 127) == 0) {
			while (s->ring_head - __atomic_load_n(&s->ring_tail, __ATOMIC_ACQUIRE) >
			       256) {
				__builtin_ia32_pause();
				clock_gettime(CLOCK_MONOTONIC, &t1);
				if (t1.tv_sec - t0.tv_sec > 10)
					break;
			}
		}
	}
	__atomic_store_n(&producer_done, 1, __ATOMIC_RELEASE);
	return NULL;
}

static void test_consumer(void)
{
	const long n = 300000;
	attach(TS_PPM);
	producer_done = 0;
	producer_tid = 0;
	pthread_t th;
	pthread_create(&th, NULL, producer, (void *)n);
	struct ts_thread_slot *s = NULL;
	while (!s)
		s = producer_tid ? slot_of(producer_tid) : NULL;
	uint64_t got = 0, last_id = 0, out_of_order = 0, first_half = 0;
	for (;;) {
		int done = __atomic_load_n(&producer_done, __ATOMIC_ACQUIRE);
		uint64_t head = __atomic_load_n(&s->ring_head, __ATOMIC_ACQUIRE);
		for (uint64_t t = s->ring_tail; t < head; t++) {
			uint64_t id = s->ring[t & (TS_RING_CAPACITY - 1)].request_id;
			if (got && id <= last_id)
				out_of_order++;
			last_id = id;
			got++;
			first_half += id >= 1 && id < (uint64_t)n / 2;
		}
		__atomic_store_n(&s->ring_tail, head, __ATOMIC_RELEASE);
		if (done && head == s->ring_head)
			break;
	}
	pthread_join(th, NULL);
	detach();
	printf("  consumer: %llu drained, %llu dropped (ring full) of %ld\n",
	       (unsigned long long)got, (unsigned long long)s->dropped_ring_full, n);
	CHECK(got + s->dropped_ring_full == (uint64_t)n + 1);
	CHECK(got >= (uint64_t)n / 2);
	/* the waiting half lost nothing */
	CHECK(first_half == (uint64_t)n / 2 - 1);
	if (first_half != (uint64_t)n / 2 - 1)
		printf("  consumer: %llu of the first half's %ld drained\n",
		       (unsigned long long)first_half, n / 2 - 1);
	CHECK(out_of_order == 0);
	CHECK(s->state == TS_SLOT_EXITED);
}

/* 300 threads alive at once: TS_MAX_SLOTS minus those taken get a slot. */
static pthread_barrier_t barrier;

static void *many_thread(void *arg)
{
	(void)arg;
	tailscope_request_begin(7);
	tailscope_request_end(7);
	pthread_barrier_wait(&barrier);
	return NULL;
}

static uint32_t live_slots(void)
{
	uint32_t n = 0;
	for (int i = 0; i < TS_MAX_SLOTS; i++)
		n += slots[i].state == TS_SLOT_LIVE;
	return n;
}

static void test_many_threads(void)
{
	enum { N = 300 };
	static pthread_t th[N];
	uint32_t live = live_slots();
	uint64_t exhausted0 = hdr->slots_exhausted;
	pthread_barrier_init(&barrier, NULL, N + 1);
	for (int i = 0; i < N; i++)
		pthread_create(&th[i], NULL, many_thread, NULL);
	/* wait for all to register, then count before anyone exits */
	while (live_slots() + (hdr->slots_exhausted - exhausted0) < live + N)
		usleep(1000);
	CHECK(live_slots() == TS_MAX_SLOTS);
	pthread_barrier_wait(&barrier);
	for (int i = 0; i < N; i++)
		pthread_join(th[i], NULL);
	uint64_t exhausted = hdr->slots_exhausted - exhausted0;
	printf("  %d threads: %llu found no slot (expect %u)\n", N, (unsigned long long)exhausted,
	       N - (TS_MAX_SLOTS - live));
	CHECK(exhausted == N - (TS_MAX_SLOTS - live));
	CHECK(hdr->slots_used == TS_MAX_SLOTS);
	CHECK(live_slots() == live);
	/* exited, drained slots are reused */
	struct rate_run r = {.n = 1000};
	attach(TS_PPM);
	on_thread(rate_thread, &r);
	detach();
	CHECK(r.records == 1000 && r.bad == 0);
	CHECK(hdr->slots_exhausted - exhausted0 == exhausted);
}

static void test_fork(void)
{
	char parent_path[64];
	snprintf(parent_path, sizeof(parent_path), "%s", tailscope_region_path());
	fflush(stdout);
	pid_t pid = fork();
	if (pid == 0) {
		int bad = 0;
		char want[64];
		snprintf(want, sizeof(want), TS_REGION_PATH_FMT, (int)getpid());
		const char *path = tailscope_region_path();
		bad += !path || strcmp(path, want) != 0;
		struct ts_region_header *h = map_region(getpid());
		bad += !h || h->pid != (uint32_t)getpid() || h->magic != TS_ABI_MAGIC;
		bad += !h || strcmp(h->kinds[1], "GET") != 0 || h->kinds_count != 3;
		bad += access(parent_path, F_OK) != 0;
		if (h) {
			h->agent_pid = 1;
			h->sample_ppm_agent = TS_PPM;
			tailscope_request_begin(5); /* re-registers in the child region */
			tailscope_request_end(5);
			struct ts_thread_slot *s = (struct ts_thread_slot *)(h + 1);
			bad += h->slots_used != 1 || s->tid != (uint32_t)getpid() ||
			       s->ring_head != 1 || s->ring[0].request_id != 5;
		}
		exit(bad);
	}
	int status = 0;
	waitpid(pid, &status, 0);
	CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0);
	char child_path[64];
	snprintf(child_path, sizeof(child_path), TS_REGION_PATH_FMT, (int)pid);
	CHECK(access(child_path, F_OK) != 0); /* child's destructor unlinked it */
	CHECK(access(parent_path, F_OK) == 0);
}

/* A fake kcounters map (real BPF array, we play BPF): the record carries
 * the counter deltas accumulated between begin and end. */
static struct ts_kcounters *fake;

static void *fake_kc_thread(void *arg)
{
	(void)arg;
	tailscope_request_begin(0);
	tailscope_request_end(0);
	struct ts_thread_slot *s = slot_of(gettid());
	CHECK(s != NULL);
	if (!s)
		return NULL;
	drain(s);
	struct ts_kcounters *e = fake_kc_entry(fake, gettid());
	CHECK(e != NULL && e->tid == (__u32)gettid());
	if (!e)
		return NULL;
	/* BPF has not seen this running thread switch in (switch_in_ns 0):
	 * its on-CPU start is unknown, so the request gets no counters */
	tailscope_request_begin_kind(9, 2);
	fake_kc_add(e, 5000, 700, 3);
	tailscope_request_end(9);
	CHECK(s->ring_head == s->ring_tail + 1);
	struct ts_request_record *r = &s->ring[s->ring_tail & (TS_RING_CAPACITY - 1)];
	CHECK(r->request_id == 9 && r->flags == TS_REC_SAMPLED);
	/* and its interrupts were not accounted past its begin */
	CHECK(e->sampled_refs == 0);
	drain(s);
	/* a thread that is on CPU since switch_in_ns: its open interval
	 * counts as on-CPU time */
	__atomic_fetch_add(&e->seq, 1, __ATOMIC_ACQ_REL);
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	e->switch_in_ns = (__u64)ts.tv_sec * 1000000000ull + ts.tv_nsec;
	__atomic_fetch_add(&e->seq, 1, __ATOMIC_ACQ_REL);
	tailscope_request_begin_kind(10, 2);
	fake_kc_add(e, 5000, 700, 3);
	tailscope_request_end(10);
	CHECK(s->ring_head == s->ring_tail + 1);
	r = &s->ring[s->ring_tail & (TS_RING_CAPACITY - 1)];
	CHECK(r->flags == (TS_REC_SAMPLED | TS_REC_COUNTERS));
	CHECK(r->runnable_ns == 5000 && r->runnable_count == 1);
	CHECK(r->irq_ns == 700 && r->irq_count == 1 && r->fault_user_count == 3);
	CHECK(r->blocked_ns == 0 && r->oncpu_ns <= r->latency_ns && r->request_id == 10 &&
	      r->kind == 2);
	tailscope_request_begin(11);
	usleep(2000);
	tailscope_request_end(11);
	r = &s->ring[(s->ring_tail + 1) & (TS_RING_CAPACITY - 1)];
	CHECK(r->request_id == 11 && (r->flags & TS_REC_COUNTERS));
	CHECK(r->oncpu_ns >= 2000000 && r->oncpu_ns <= r->latency_ns);
	drain(s);
	/* burst windows: while the gate is closed nothing is sampled */
	hdr->burst_gate = (1u << TS_BURST_WINDOW_SHIFT) | TS_BURST_CLOSED;
	tailscope_request_begin(20);
	tailscope_request_end(20);
	CHECK(s->ring_head == s->ring_tail);
	/* closing (programs still attached): the request keeps its counters */
	hdr->burst_gate = 2u << TS_BURST_WINDOW_SHIFT;
	tailscope_request_begin(21);
	hdr->burst_gate |= TS_BURST_CLOSED;
	tailscope_request_end(21);
	r = &s->ring[s->ring_tail & (TS_RING_CAPACITY - 1)];
	CHECK(s->ring_head == s->ring_tail + 1 && r->request_id == 21);
	CHECK(r->flags == (TS_REC_SAMPLED | TS_REC_COUNTERS));
	/* detached before it ended, or ended in a later window: latency only */
	hdr->burst_gate = 3u << TS_BURST_WINDOW_SHIFT;
	tailscope_request_begin(22);
	hdr->burst_gate |= TS_BURST_CLOSED | TS_BURST_DETACHED;
	tailscope_request_end(22);
	hdr->burst_gate = 4u << TS_BURST_WINDOW_SHIFT;
	tailscope_request_begin(23);
	hdr->burst_gate = 5u << TS_BURST_WINDOW_SHIFT;
	tailscope_request_end(23);
	CHECK(s->ring_head == s->ring_tail + 3);
	r = &s->ring[(s->ring_tail + 1) & (TS_RING_CAPACITY - 1)];
	CHECK(r->request_id == 22 && r->flags == TS_REC_SAMPLED && r->latency_ns > 0);
	r = &s->ring[(s->ring_tail + 2) & (TS_RING_CAPACITY - 1)];
	CHECK(r->request_id == 23 && r->flags == TS_REC_SAMPLED);
	hdr->burst_gate = 0;
	drain(s);
	/* the agent goes away: records lose their counters, nothing breaks */
	((struct ts_kc_header *)fake)->live = 0;
	tailscope_request_begin(12);
	tailscope_request_end(12);
	r = &s->ring[s->ring_tail & (TS_RING_CAPACITY - 1)];
	CHECK(r->request_id == 12 && r->flags == TS_REC_SAMPLED);
	drain(s);
	return NULL;
}

static void test_fake_kcounters(void)
{
	fake = fake_kc_create();
	if (!fake) {
		printf("  skip fake kcounters: cannot create a BPF array (not root?)\n");
		return;
	}
	usleep(150000); /* earlier failed opens of the real path back off 100 ms */
	attach(TS_PPM);
	on_thread(fake_kc_thread, NULL);
	detach();
	fake_kc_destroy(fake);
	ts_kc_pin_path = NULL;
}

/* A thread with one sampled request; *arg gets its tid. */
static void *claim_thread(void *arg)
{
	tailscope_request_begin(1);
	tailscope_request_end(1);
	struct ts_thread_slot *s = slot_of(gettid());
	if (s)
		drain(s);
	*(pid_t *)arg = gettid();
	return NULL;
}

static int claimed(struct ts_kcounters *kc, pid_t tid)
{
	for (__u32 i = 0; i < TS_KC_PROBE; i++) {
		__u32 idx = ((__u32)tid + i) & (TS_KC_ENTRIES - 1);
		if (idx && kc[idx].tid == (__u32)tid)
			return 1;
	}
	return 0;
}

/* Mappings of BPF arrays in this process. */
static int bpf_map_mappings(void)
{
	FILE *f = fopen("/proc/self/maps", "r");
	char line[512];
	int n = 0;
	while (f && fgets(line, sizeof(line), f))
		n += strstr(line, "bpf-map") != NULL;
	if (f)
		fclose(f);
	return n;
}

/* The runtime uses the array of its region's agent (kcounters-<pid>), and
 * moves when another agent takes over or when a dead agent's array (live
 * cleared by the next agent to load) is replaced at the same path. */
static void test_agent_change(void)
{
	const __u32 A = 3999001, B = 3999002;
	char pa[64], pb[64];
	snprintf(pa, sizeof(pa), TS_KC_PIN_PREFIX "%u", A);
	snprintf(pb, sizeof(pb), TS_KC_PIN_PREFIX "%u", B);
	mkdir(TS_KC_PIN_DIR, 0755);
	struct ts_kcounters *ka = fake_kc_create_at(pa, A), *kb = fake_kc_create_at(pb, B);
	if (!ka || !kb) {
		printf("  skip agent change: cannot create BPF arrays (not root?)\n");
		unlink(pa);
		unlink(pb);
		return;
	}
	usleep(150000); /* earlier failed opens back off 100 ms */
	pid_t t1 = 0, t2 = 0, t3 = 0;
	attach(TS_PPM);
	hdr->agent_pid = A;
	int maps0 = bpf_map_mappings();
	on_thread(claim_thread, &t1);
	CHECK(claimed(ka, t1) && !claimed(kb, t1));
	CHECK(bpf_map_mappings() == maps0 + 1);
	hdr->agent_pid = B; /* another agent took the region over */
	on_thread(claim_thread, &t2);
	CHECK(claimed(kb, t2) && !claimed(ka, t2));
	/* A's mapping was released (replaced by zero pages), B's made */
	CHECK(bpf_map_mappings() == maps0 + 1);
	/* B was killed; a new agent with B's pid clears the old array's live,
	 * then pins its own at the same path. */
	((struct ts_kc_header *)kb)->live = 0;
	struct ts_kcounters *kb2 = fake_kc_create_at(pb, B);
	CHECK(kb2 != NULL);
	if (kb2) {
		on_thread(claim_thread, &t3);
		CHECK(claimed(kb2, t3) && !claimed(kb, t3));
	}
	detach();
	((struct ts_kc_header *)ka)->live = 0;
	if (kb2)
		((struct ts_kc_header *)kb2)->live = 0;
	unlink(pa);
	unlink(pb);
}

/* With a real agent's array. */
static void test_kcounters(void)
{
	if (!use_any_agent_kc()) {
		printf("  skip kcounters: no agent running (no %s*)\n", TS_KC_PIN_PREFIX);
		return;
	}
	struct rate_run r = {.n = 1000};
	attach(TS_PPM);
	on_thread(rate_thread, &r);
	detach();
	ts_kc_pin_path = NULL;
	CHECK(r.records == 1000 && r.bad == 0);
}

int main(int argc, char **argv)
{
	(void)argc;
	const char *s = getenv("TAILSCOPE_SAMPLE");
	if (!s || strcmp(s, "0") != 0) {
		setenv("TAILSCOPE_SAMPLE", "0", 1);
		execv("/proc/self/exe", argv);
		perror("execv");
		return 1;
	}
	test_parse();
	test_region_header();
	test_kinds();
	test_sampling();
	test_no_agent();
	test_effective_rate();
	test_agent_heartbeat();
	test_agent_change();
	test_end_without_begin();
	test_ring_overflow();
	test_ring_wakes_agent();
	test_exit_wakes_agent();
	test_futex_wakes_another_mapping();
	test_consumer();
	test_many_threads();
	test_fork();
	test_fake_kcounters();
	test_kcounters();
	printf("%d passed, %d failed\n", passed, failed);
	return failed != 0;
}
