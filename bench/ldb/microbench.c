/* microbench.c — cost of one instrumented call (enter + exit).
 *
 * The same source is built several ways (see Makefile): plain, with
 * -finstrument-functions and empty hooks, with -finstrument-functions and
 * libtailscope's shadow-stack hooks, and with -pg (glibc's mcount, and
 * under `uftrace record`). Each run calls leaf() N times from a loop and
 * prints the wall time per call; bench/ldb/run.py subtracts the plain
 * build's time to get the cost of the instrumentation.
 *
 *   usage: microbench N
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

static uint64_t now_ns(void) {
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

volatile uint64_t sink;

__attribute__((noinline)) uint64_t leaf(uint64_t x) {
	__asm__ volatile("" : "+r"(x));
	return x * 2654435761u + 1;
}

__attribute__((noinline)) uint64_t loop(uint64_t n) {
	uint64_t acc = 0;
	for (uint64_t i = 0; i < n; i++) acc += leaf(i);
	return acc;
}

int main(int argc, char **argv) {
	uint64_t n = argc > 1 ? strtoull(argv[1], NULL, 10) : 10000000;
	sink = loop(n / 10); /* warm up */
	uint64_t t0 = now_ns();
	sink = loop(n);
	uint64_t t1 = now_ns();
	printf("%.3f ns/call (%llu calls)\n", (double)(t1 - t0) / (double)n,
	       (unsigned long long)n);
	return 0;
}
