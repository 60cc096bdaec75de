/* lockbench.c — cost of one pthread_mutex_lock + unlock pair, uncontended.
 *
 * Built twice (see Makefile): plain (glibc's mutex) and linked with
 * libtailscope (its lock shim interposes pthread_mutex_*). With the shim,
 * `lockbench N REPS off` times the pairs while no recording runs, and
 * `on` while one does: like the agent, it maps its own region and sets
 * agent_pid and ldb_flags (TS_LDB_LOCKS), so each lock takes the shim's
 * recording path (trylock, a time stamp after acquiring and one just
 * before releasing; holds are far below the 1 us threshold, so nothing is
 * logged). A warm-up of 20 ms first lets the shim calibrate its TSC scale.
 * Prints the best batch's time per pair, then the median batch's.
 *
 * A second thread stays parked for the whole run, as in any server: in a
 * process with one thread glibc's pthread_mutex_lock/unlock skip their
 * lock prefix (__libc_single_threaded) while pthread_mutex_trylock keeps
 * it, so a single-threaded run made glibc's pair ~12 ns cheaper than a
 * server's and charged the shim's trylock for the difference (session 11:
 * glibc 3.2 against 15.6 ns per pair with the parked thread).
 *
 *   usage: lockbench N REPS [off|on]
 */
#define _GNU_SOURCE
#include <fcntl.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#ifdef WITH_TAILSCOPE
#include "tailscope/abi.h"
#include "tailscope/tailscope.h"
#endif

static uint64_t now_ns(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
volatile uint64_t sink;

__attribute__((noinline)) static void pairs(uint64_t n)
{
	for (uint64_t i = 0; i < n; i++) {
		pthread_mutex_lock(&mu);
		sink++;
		pthread_mutex_unlock(&mu);
	}
}

static int cmp_double(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;
	return (x > y) - (x < y);
}

#ifdef WITH_TAILSCOPE
static int recording_on(void)
{
	if (!tailscope_enabled())
		return 0;
	char path[64];
	snprintf(path, sizeof(path), TS_REGION_PATH_FMT, getpid());
	int fd = open(path, O_RDWR);
	struct stat st;
	if (fd < 0 || fstat(fd, &st) != 0)
		return 0;
	struct ts_region_header *hdr =
	    mmap(NULL, (size_t)st.st_size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	close(fd);
	if (hdr == MAP_FAILED)
		return 0;
	hdr->agent_pid = (uint32_t)getpid();
	hdr->ldb_flags = TS_LDB_LOCKS;
	return 1;
}
#endif

static void *parked(void *arg)
{
	(void)arg;
	for (;;)
		pause();
	return NULL;
}

int main(int argc, char **argv)
{
	uint64_t n = argc > 1 ? strtoull(argv[1], NULL, 10) : 2000000;
	int reps = argc > 2 ? atoi(argv[2]) : 7;
	int on = argc > 3 && strcmp(argv[3], "on") == 0;
	if (n == 0 || reps < 1 || reps > 1000 || (argc > 3 && !on && strcmp(argv[3], "off"))) {
		fprintf(stderr, "usage: lockbench N [REPS] [off|on]  (N > 0, 1 <= REPS <= 1000)\n");
		return 2;
	}
#ifdef WITH_TAILSCOPE
	if (on && !recording_on()) {
		fprintf(stderr, "lockbench: cannot map the tailscope region\n");
		return 1;
	}
#else
	if (on) {
		fprintf(stderr, "lockbench: 'on' needs the libtailscope build\n");
		return 2;
	}
#endif
	pthread_t th;
	if (pthread_create(&th, NULL, parked, NULL) != 0) {
		fprintf(stderr, "lockbench: cannot start the parked thread\n");
		return 1;
	}
	for (uint64_t t = now_ns() + 20000000; now_ns() < t;)
		pairs(1000); /* warm up; the shim calibrates its TSC scale */
	double per[1000];
	for (int r = 0; r < reps; r++) {
		uint64_t t0 = now_ns();
		pairs(n);
		per[r] = (double)(now_ns() - t0) / (double)n;
	}
	qsort(per, (size_t)reps, sizeof(double), cmp_double);
	printf("%.3f ns/pair (best of %d batches of %llu pairs; median batch %.3f)\n", per[0], reps,
	       (unsigned long long)n, per[reps / 2]);
	return 0;
}
