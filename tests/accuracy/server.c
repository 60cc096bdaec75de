/* server.c — the accuracy-test server: a TCP service with a known,
 * injected cause of tail latency, instrumented with libtailscope.
 *
 * tailscope should rank the injected cause first; the ground truth never
 * reaches the analyser (only --truth writes it, to a separate file).
 *
 * Model: ONE worker thread, pinned to --cpu, serves every connection from
 * an epoll loop. Protocol: the client sends "REQ <id>\n", the server
 * replies "OK <id>\n". Each request is wrapped in
 * tailscope_request_begin_kind(id, "REQ") / tailscope_request_end(id)
 * (end after the reply is written) and does --work-us of calibrated,
 * deterministic hashing, under a mutex that only the `lock` injector
 * ever contends.
 *
 * Injections (intermittent, so they make a tail, not a shift):
 *   hog     a thread pinned to the SAME CPU busy-loops 1-3 ms every
 *           2-4 ms at SCHED_FIFO (nice -10 without root), so it preempts
 *           requests in flight: runnable wait. Only a request in flight
 *           when a burst starts waits inside its begin..end (the others
 *           wait in the socket, before begin), about one per burst: the
 *           bursts are frequent so that these are 2-5% of requests, well
 *           above the 1% that p99 looks at (at 8-16 ms gaps they were
 *           ~1.4%, and a seed that drew fewer than 1% left p99 untouched).
 *   lock    a thread on the OTHER CPU takes the worker's mutex every
 *           20-50 ms and holds it 1-3 ms, sleeping: blocked wait (futex).
 *   faults  a fraction F (default 2%) of requests drop a 4 MiB buffer with
 *           MADV_DONTNEED and touch it again page by page: page faults.
 *   ipi     a thread on the OTHER CPU toggles mprotect on a buffer the
 *           worker touches every request, in 2-5 ms bursts every 20-50 ms:
 *           TLB-shootdown IPIs (CAL) land on the worker's CPU: irq time.
 *   none    nothing.
 * Bursts are drawn from an xorshift PRNG seeded by --seed.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <pthread.h>
#include <sched.h>
#include <sys/resource.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "tailscope/tailscope.h"

#define FAULT_BUF (4u << 20)
#define IPI_BUF (128u << 10) /* 32 pages: ranged flush, one INVLPG per page in the IPI */
#define MAX_CONNS 4096
#define PAGE 4096

enum inject { INJ_NONE, INJ_HOG, INJ_LOCK, INJ_FAULTS, INJ_IPI };
static const char *inject_names[] = {"none", "hog", "lock", "faults", "ipi"};

static struct {
	int port, cpu, other_cpu;
	double work_us, inject_fraction;
	enum inject inject;
	uint64_t seed;
	const char *truth_path;
} cfg = {.port = 7070, .work_us = 50, .inject_fraction = 0.02, .seed = 1};

static volatile sig_atomic_t stopping;
static volatile int inject_active; /* an injector burst is running */
/* Bursts started so far. A hog burst preempts the worker, so the worker never
 * sees inject_active set: a request overlapped a burst if one started while
 * it ran. */
static _Atomic uint64_t inject_bursts;
static pthread_mutex_t work_lock = PTHREAD_MUTEX_INITIALIZER;
static double iters_per_us;
static uint8_t *fault_buf, *ipi_buf;
static uint64_t *truth_ids;
static size_t truth_n, truth_cap;

/* ---- small utilities ----------------------------------------------- */

static uint64_t now_ns(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ull + ts.tv_nsec;
}

static uint64_t xorshift(uint64_t *s)
{
	uint64_t x = *s;
	x ^= x << 13;
	x ^= x >> 7;
	x ^= x << 17;
	return *s = x;
}

/* Uniform integer in [lo, hi]. */
static uint64_t uniform(uint64_t *s, uint64_t lo, uint64_t hi)
{
	return lo + xorshift(s) % (hi - lo + 1);
}

static void sleep_ns(uint64_t ns)
{
	struct timespec ts = {(time_t)(ns / 1000000000ull), (long)(ns % 1000000000ull)};
	while (nanosleep(&ts, &ts) != 0 && errno == EINTR && !stopping) {
	}
}

static void spin_until(uint64_t deadline)
{
	while (now_ns() < deadline) {
	}
}

static void pin_to(int cpu)
{
	cpu_set_t set;
	CPU_ZERO(&set);
	CPU_SET(cpu, &set);
	if (sched_setaffinity(0, sizeof(set), &set) != 0)
		fprintf(stderr, "server: cannot pin to cpu %d: %s\n", cpu, strerror(errno));
}

/* ---- the work: deterministic hashing ---------------------------------- */

static uint64_t hash_rounds(uint64_t h, uint64_t n)
{
	for (uint64_t i = 0; i < n; i++) {
		h ^= h >> 33;
		h *= 0xff51afd7ed558ccdull;
		h ^= i;
	}
	return h;
}

static void calibrate(void)
{
	uint64_t n = 1000000, t0 = now_ns();
	volatile uint64_t sink = hash_rounds(cfg.seed, n);
	(void)sink;
	iters_per_us = (double)n / ((now_ns() - t0) / 1000.0);
}

/* ---- injectors --------------------------------------------------------- */

/* Run one burst of `fn` for len_min..len_max ms every gap_min..gap_max ms
 * until stopping. */
static void burst_loop(uint64_t *rng, void (*burst)(uint64_t deadline), uint64_t gap_min,
                       uint64_t gap_max, uint64_t len_min, uint64_t len_max)
{
	while (!stopping) {
		sleep_ns(uniform(rng, gap_min, gap_max) * 1000000ull);
		uint64_t deadline =
		    now_ns() + uniform(rng, len_min * 1000, len_max * 1000) * 1000ull;
		inject_active = 1;
		atomic_fetch_add_explicit(&inject_bursts, 1, memory_order_relaxed);
		burst(deadline);
		inject_active = 0;
	}
}

static void hog_burst(uint64_t deadline)
{
	spin_until(deadline);
}

static void lock_burst(uint64_t deadline)
{
	pthread_mutex_lock(&work_lock);
	sleep_ns(deadline > now_ns() ? (deadline - now_ns()) / 2 + 500000 : 1000000);
	pthread_mutex_unlock(&work_lock);
}

static void ipi_burst(uint64_t deadline)
{
	while (now_ns() < deadline) {
		mprotect(ipi_buf, IPI_BUF, PROT_READ);
		mprotect(ipi_buf, IPI_BUF, PROT_READ | PROT_WRITE);
	}
}

static void *injector(void *arg)
{
	(void)arg;
	uint64_t rng = cfg.seed * 0x9E3779B97F4A7C15ull + 1;
	switch (cfg.inject) {
	case INJ_HOG: {
		/* A real-time burst preempts the worker mid-request, as a higher-
		 * priority job sharing the core would; without root, a nice -10
		 * hog (CFS weight 9548 vs 1024) does nearly the same. */
		struct sched_param sp = {.sched_priority = 1};
		pin_to(cfg.cpu);
		if (sched_setscheduler(0, SCHED_FIFO, &sp) != 0 &&
		    setpriority(PRIO_PROCESS, 0, -10) != 0)
			fprintf(stderr, "server: hog runs at default priority: %s\n",
			        strerror(errno));
		burst_loop(&rng, hog_burst, 2, 4, 1, 3);
		break;
	}
	case INJ_LOCK:
		pin_to(cfg.other_cpu);
		burst_loop(&rng, lock_burst, 20, 50, 2, 5);
		break;
	case INJ_IPI:
		pin_to(cfg.other_cpu);
		burst_loop(&rng, ipi_burst, 20, 50, 2, 5);
		break;
	default:
		break;
	}
	return NULL;
}

/* faults: does request `id` take the fault storm? Deterministic in seed. */
static int faults_hit(uint64_t id)
{
	uint64_t s = (id + 1) * 0xD1B54A32D192ED03ull ^ cfg.seed;
	xorshift(&s);
	return (double)(xorshift(&s) >> 11) / 9007199254740992.0 < cfg.inject_fraction;
}

static void fault_storm(void)
{
	madvise(fault_buf, FAULT_BUF, MADV_DONTNEED);
	for (size_t off = 0; off < FAULT_BUF; off += PAGE)
		fault_buf[off] = 1;
}

/* ---- request handling --------------------------------------------------- */

static void truth_add(uint64_t id)
{
	if (!cfg.truth_path)
		return;
	if (truth_n == truth_cap) {
		truth_cap = truth_cap ? truth_cap * 2 : 4096;
		truth_ids = realloc(truth_ids, truth_cap * sizeof(*truth_ids));
	}
	truth_ids[truth_n++] = id;
}

/* Handle one request; returns 0 if the reply was written. */
static int handle(int fd, uint64_t id, int kind)
{
	tailscope_request_begin_kind(id, kind);
	int hit = inject_active;
	uint64_t bursts0 = atomic_load_explicit(&inject_bursts, memory_order_relaxed);
	pthread_mutex_lock(&work_lock);
	if (cfg.inject == INJ_FAULTS && faults_hit(id)) {
		fault_storm();
		hit = 1;
	}
	/* read (never write: the ipi injector makes it read-only at times) a
	 * page of the shared buffer, so its TLB entries live on this CPU */
	uint64_t touch = ipi_buf[(id % (IPI_BUF / PAGE)) * PAGE];
	volatile uint64_t sink =
	    hash_rounds(cfg.seed ^ id ^ touch, (uint64_t)(cfg.work_us * iters_per_us));
	(void)sink;
	pthread_mutex_unlock(&work_lock);
	char out[40];
	int n = snprintf(out, sizeof(out), "OK %llu\n", (unsigned long long)id);
	int off = 0;
	while (off < n) {
		ssize_t w = write(fd, out + off, n - off);
		if (w > 0)
			off += (int)w;
		else if (w < 0 && errno == EAGAIN)
			continue;
		else
			break;
	}
	hit |=
	    inject_active || atomic_load_explicit(&inject_bursts, memory_order_relaxed) != bursts0;
	tailscope_request_end(id);
	if (hit)
		truth_add(id);
	return off == n ? 0 : -1;
}

struct conn {
	char buf[4096];
	size_t len;
};
static struct conn *conns[MAX_CONNS];

/* Parse complete lines in c->buf; returns -1 to close the connection. */
static int serve_lines(int fd, struct conn *c, int kind)
{
	char *start = c->buf, *end = c->buf + c->len, *nl;
	while ((nl = memchr(start, '\n', end - start)) != NULL) {
		*nl = '\0';
		if (strncmp(start, "REQ ", 4) != 0)
			return -1;
		uint64_t id = strtoull(start + 4, NULL, 10);
		if (handle(fd, id, kind) != 0)
			return -1;
		start = nl + 1;
	}
	c->len = end - start;
	memmove(c->buf, start, c->len);
	return c->len == sizeof(c->buf) ? -1 : 0;
}

static void close_conn(int ep, int fd)
{
	epoll_ctl(ep, EPOLL_CTL_DEL, fd, NULL);
	close(fd);
	free(conns[fd]);
	conns[fd] = NULL;
}

static void accept_all(int ep, int lfd)
{
	for (;;) {
		int fd = accept4(lfd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
		if (fd < 0)
			return;
		if (fd >= MAX_CONNS || !(conns[fd] = calloc(1, sizeof(struct conn)))) {
			close(fd);
			continue;
		}
		int one = 1;
		setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
		struct epoll_event ev = {.events = EPOLLIN, .data.fd = fd};
		epoll_ctl(ep, EPOLL_CTL_ADD, fd, &ev);
	}
}

static void on_readable(int ep, int fd, int kind)
{
	struct conn *c = conns[fd];
	ssize_t r = read(fd, c->buf + c->len, sizeof(c->buf) - c->len);
	if (r == 0 || (r < 0 && errno != EAGAIN && errno != EINTR)) {
		close_conn(ep, fd);
		return;
	}
	if (r > 0) {
		c->len += (size_t)r;
		if (serve_lines(fd, c, kind) != 0)
			close_conn(ep, fd);
	}
}

static int listen_on(int port)
{
	int fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0), one = 1;
	setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
	struct sockaddr_in a = {
	    .sin_family = AF_INET, .sin_port = htons(port), .sin_addr.s_addr = htonl(INADDR_ANY)};
	if (bind(fd, (struct sockaddr *)&a, sizeof(a)) != 0 || listen(fd, 1024) != 0) {
		perror("server: bind/listen");
		exit(1);
	}
	return fd;
}

static void serve(int lfd)
{
	int kind = tailscope_kind("REQ");
	int ep = epoll_create1(EPOLL_CLOEXEC);
	struct epoll_event ev = {.events = EPOLLIN, .data.fd = lfd}, evs[64];
	epoll_ctl(ep, EPOLL_CTL_ADD, lfd, &ev);
	while (!stopping) {
		int n = epoll_wait(ep, evs, 64, 100);
		for (int i = 0; i < n; i++) {
			if (evs[i].data.fd == lfd)
				accept_all(ep, lfd);
			else
				on_readable(ep, evs[i].data.fd, kind);
		}
	}
}

/* ---- setup ---------------------------------------------------------------- */

static void usage(void)
{
	fprintf(stderr, "usage: server [--port P] [--cpu C] [--work-us US] "
	                "[--inject none|hog|lock|faults|ipi] [--seed S] "
	                "[--inject-fraction F] [--truth FILE]\n");
	exit(2);
}

static void parse_args(int argc, char **argv)
{
	for (int i = 1; i < argc; i++) {
		const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
		if (!v)
			usage();
		if (!strcmp(a, "--port"))
			cfg.port = atoi(v);
		else if (!strcmp(a, "--cpu"))
			cfg.cpu = atoi(v);
		else if (!strcmp(a, "--work-us"))
			cfg.work_us = atof(v);
		else if (!strcmp(a, "--seed"))
			cfg.seed = strtoull(v, NULL, 10);
		else if (!strcmp(a, "--inject-fraction"))
			cfg.inject_fraction = atof(v);
		else if (!strcmp(a, "--truth"))
			cfg.truth_path = v;
		else if (!strcmp(a, "--inject")) {
			int k = -1;
			for (int j = 0; j < 5; j++)
				if (!strcmp(v, inject_names[j]))
					k = j;
			if (k < 0)
				usage();
			cfg.inject = (enum inject)k;
		} else
			usage();
		i++;
	}
	long ncpu = sysconf(_SC_NPROCESSORS_ONLN);
	cfg.other_cpu = ncpu > 1 ? (cfg.cpu + 1) % (int)ncpu : cfg.cpu;
}

static void write_truth(void)
{
	if (!cfg.truth_path)
		return;
	FILE *f = fopen(cfg.truth_path, "w");
	if (!f) {
		perror("server: truth file");
		return;
	}
	fprintf(f, "# inject=%s seed=%llu: request ids that overlapped an injection\n",
	        inject_names[cfg.inject], (unsigned long long)cfg.seed);
	for (size_t i = 0; i < truth_n; i++)
		fprintf(f, "%llu\n", (unsigned long long)truth_ids[i]);
	fclose(f);
}

static void on_signal(int sig)
{
	(void)sig;
	stopping = 1;
}

int main(int argc, char **argv)
{
	parse_args(argc, argv);
	signal(SIGINT, on_signal);
	signal(SIGTERM, on_signal);
	signal(SIGPIPE, SIG_IGN);
	pin_to(cfg.cpu); /* the worker is the main thread */
	calibrate();
	fault_buf =
	    mmap(NULL, FAULT_BUF, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	ipi_buf = mmap(NULL, IPI_BUF, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (fault_buf == MAP_FAILED || ipi_buf == MAP_FAILED) {
		perror("server: mmap");
		return 1;
	}
	memset(fault_buf, 1, FAULT_BUF);
	memset(ipi_buf, 1, IPI_BUF); /* real writable PTEs, so mprotect must flush */
	madvise(fault_buf, FAULT_BUF, MADV_NOHUGEPAGE);
	int lfd = listen_on(cfg.port);
	pthread_t inj;
	if (cfg.inject != INJ_NONE && cfg.inject != INJ_FAULTS)
		pthread_create(&inj, NULL, injector, NULL);
	fprintf(
	    stderr,
	    "server: port %d cpu %d inject %s seed %llu work %.0fus (%.1f iters/us) region %s\n",
	    cfg.port, cfg.cpu, inject_names[cfg.inject], (unsigned long long)cfg.seed, cfg.work_us,
	    iters_per_us, tailscope_region_path() ? tailscope_region_path() : "(disabled)");
	serve(lfd);
	if (cfg.inject != INJ_NONE && cfg.inject != INJ_FAULTS)
		pthread_join(inj, NULL);
	write_truth();
	return 0;
}
