/* microbench.c — cost of one instrumented call (enter + exit).
 *
 * The same source is built several ways (see Makefile): plain, with
 * -finstrument-functions and empty hooks, with -finstrument-functions and
 * libtailscope's shadow-stack hooks, and with -pg (glibc's mcount, and
 * under `uftrace record`). Each run times REPS batches of N calls of leaf()
 * from a loop and prints the best batch's wall time per call, then the
 * median batch's. Other work on a shared machine can only add time to a
 * batch, so the best one estimates the cost itself; bench/ldb/run.py takes
 * the median over interleaved runs and subtracts the plain build's time to
 * get the cost of the instrumentation.
 *
 *   usage: microbench N [REPS]
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

static uint64_t now_ns(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

volatile uint64_t sink;

__attribute__((noinline)) uint64_t leaf(uint64_t x)
{
	__asm__ volatile("" : "+r"(x));
	return x * 2654435761u + 1;
}

__attribute__((noinline)) uint64_t loop(uint64_t n)
{
	uint64_t acc = 0;
	for (uint64_t i = 0; i < n; i++)
		acc += leaf(i);
	return acc;
}

static int cmp_double(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;
	return (x > y) - (x < y);
}

int main(int argc, char **argv)
{
	uint64_t n = argc > 1 ? strtoull(argv[1], NULL, 10) : 10000000;
	int reps = argc > 2 ? atoi(argv[2]) : 7;
	if (n == 0 || reps < 1 || reps > 1000) {
		fprintf(stderr, "usage: microbench N [REPS]  (N > 0, 1 <= REPS <= 1000)\n");
		return 2;
	}
	double per_call[1000];
	sink = loop(n / 10); /* warm up */
	for (int r = 0; r < reps; r++) {
		uint64_t t0 = now_ns();
		sink = loop(n);
		uint64_t t1 = now_ns();
		per_call[r] = (double)(t1 - t0) / (double)n;
	}
	qsort(per_call, (size_t)reps, sizeof(double), cmp_double);
	printf("%.3f ns/call (best of %d batches of %llu calls; median batch %.3f)\n", per_call[0],
	       reps, (unsigned long long)n, per_call[reps / 2]);
	return 0;
}
