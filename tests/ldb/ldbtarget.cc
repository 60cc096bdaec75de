// ldbtarget.cc — functions with known durations for the LDB correctness suite.
//
// Built with -finstrument-functions and libtailscope (tests/ldb/Makefile). Each mode runs a
// scenario and writes the ground truth of every timed call, measured inside the function,
// to the file named by argv[2], one line per call: "NAME IN_START IN_END OUT_START OUT_END"
// (CLOCK_MONOTONIC; IN_* taken inside the callee, OUT_* by the caller around the call).
// tests/ldb/test_ldb_suite.py records a mode with `tailscope-agent --functions` and compares.
//
//   usage: ldbtarget MODE TRUTH_FILE
//   modes: durations recursion short libcalls churn signals unwind deep
#include <pthread.h>
#include <setjmp.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

#include <stdexcept>

#include "tailscope/tailscope.h"

#define NOINLINE __attribute__((noinline))
// Helpers that are not instrumented: a signal handler's instrumented calls are exactly
// on_alarm and handler_fn (tests/ldb counts the runtime's skipped pushes against them).
// now_ns() stays instrumented: after a longjmp it is the call whose entry resynchronises.
#define NOINST __attribute__((no_instrument_function))

static FILE *truth;
static pthread_mutex_t truth_lock = PTHREAD_MUTEX_INITIALIZER;

static NOINST uint64_t clock_raw()
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static uint64_t now_ns()
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

// Ground truth brackets each call twice: the callee's own timestamps (inside its hooks)
// and the caller's (around the call, outside the hooks). The frame's true lifetime lies
// between the two; preemption can land on either side of a hook.
static __thread uint64_t inner_start, inner_end;

static NOINST void note(const char *name, uint64_t start, uint64_t end)
{
	(void)name;
	inner_start = start;
	inner_end = end;
}

static NOINST void emit(const char *name, uint64_t out_start, uint64_t out_end)
{
	pthread_mutex_lock(&truth_lock);
	fprintf(truth, "%s %d %llu %llu %llu %llu\n", name, (int)gettid(), (unsigned long long)inner_start,
		(unsigned long long)inner_end, (unsigned long long)out_start,
		(unsigned long long)out_end);
	fflush(truth);
	pthread_mutex_unlock(&truth_lock);
}

#define CALL(name, expr)                                                                           \
	do {                                                                                       \
		uint64_t call_t0_ = now_ns();                                                      \
		expr;                                                                              \
		uint64_t call_t1_ = now_ns();                                                      \
		emit(name, call_t0_, call_t1_);                                                    \
	} while (0)

static NOINST void spin_until(uint64_t t)
{
	while (clock_raw() < t) {
	}
}

static void sleep_ns(uint64_t ns)
{
	struct timespec ts = {(time_t)(ns / 1000000000ull), (long)(ns % 1000000000ull)};
	nanosleep(&ts, nullptr);
}

// ---- durations: busy, sleep, lock wait, I/O --------------------------------------------

extern "C" NOINLINE void busy_fn(uint64_t ns)
{
	uint64_t t0 = now_ns();
	spin_until(t0 + ns);
	note("busy_fn", t0, now_ns());
}

extern "C" NOINLINE void sleep_fn(uint64_t ns)
{
	uint64_t t0 = now_ns();
	sleep_ns(ns);
	note("sleep_fn", t0, now_ns());
}

static pthread_mutex_t m = PTHREAD_MUTEX_INITIALIZER;
static volatile int held;

static void *hold_lock(void *arg)
{
	uint64_t ns = *(uint64_t *)arg;
	pthread_mutex_lock(&m);
	held = 1;
	sleep_ns(ns);
	pthread_mutex_unlock(&m);
	return nullptr;
}

extern "C" NOINLINE void lock_wait_fn(void)
{
	uint64_t t0 = now_ns();
	pthread_mutex_lock(&m);
	pthread_mutex_unlock(&m);
	note("lock_wait_fn", t0, now_ns());
}

static int pipefd[2];
static void *write_later(void *arg)
{
	sleep_ns(*(uint64_t *)arg);
	char c = 'x';
	if (write(pipefd[1], &c, 1) != 1)
		abort();
	return nullptr;
}

extern "C" NOINLINE void io_fn(void)
{
	uint64_t t0 = now_ns();
	char c;
	if (read(pipefd[0], &c, 1) != 1)
		abort();
	note("io_fn", t0, now_ns());
}

static void mode_durations()
{
	for (int i = 0; i < 5; i++) {
		CALL("busy_fn", busy_fn(2000000 + i * 500000));
		CALL("sleep_fn", sleep_fn(3000000 + i * 1000000));
		uint64_t hold = 4000000;
		held = 0;
		pthread_t th;
		pthread_create(&th, nullptr, hold_lock, &hold);
		while (!held)
			usleep(50);
		CALL("lock_wait_fn", lock_wait_fn());
		pthread_join(th, nullptr);
		if (pipe(pipefd) != 0)
			abort();
		uint64_t delay = 3000000;
		pthread_create(&th, nullptr, write_later, &delay);
		CALL("io_fn", io_fn());
		pthread_join(th, nullptr);
		close(pipefd[0]);
		close(pipefd[1]);
	}
}

// ---- recursion and identical call sites in a loop --------------------------------------

extern "C" NOINLINE int rec_fn(int n)
{
	uint64_t t0 = now_ns();
	int r = 0;
	if (n > 0)
		CALL("rec_fn", r = rec_fn(n - 1) + 1);
	else
		sleep_ns(3000000);
	note("rec_fn", t0, now_ns());
	return r;
}

extern "C" NOINLINE void loop_fn(void)
{
	uint64_t t0 = now_ns();
	sleep_ns(2000000);
	note("loop_fn", t0, now_ns());
}

static void mode_recursion()
{
	for (int i = 0; i < 3; i++)
		CALL("rec_fn", rec_fn(5));
	for (int i = 0; i < 8; i++)
		CALL("loop_fn", loop_fn()); // one call site, eight calls
}

// ---- very short, high-rate calls -------------------------------------------------------

extern "C" NOINLINE uint64_t tiny_fn(uint64_t x)
{
	return x * 2654435761u + 1;
}

extern "C" NOINLINE void marker_fn(void)
{
	uint64_t t0 = now_ns();
	sleep_ns(2000000);
	note("marker_fn", t0, now_ns());
}

static void mode_short()
{
	uint64_t end = now_ns() + 1500000000ull, acc = 0;
	while (now_ns() < end) {
		for (int i = 0; i < 1000; i++)
			acc += tiny_fn(acc);
		if ((acc & 0xfff) == 0)
			CALL("marker_fn", marker_fn());
	}
	CALL("marker_fn", marker_fn());
	note("acc", acc, acc);
}

// ---- uninstrumented library frames (qsort calls back into us) ---------------------------

// cmp_fn is called by libc (qsort, not instrumented), so no instrumented caller brackets
// it: sort_fn writes its calls with sort_fn's own span as the outer bracket.
static uint64_t cmp_slow[256][2];
static int n_cmp_slow;

extern "C" NOINLINE int cmp_fn(const void *a, const void *b)
{
	int x = *(const int *)a, y = *(const int *)b;
	if ((x ^ y) == 7) { // a few slow comparisons
		uint64_t t0 = now_ns();
		sleep_ns(1000000);
		if (n_cmp_slow < 256) {
			cmp_slow[n_cmp_slow][0] = t0;
			cmp_slow[n_cmp_slow][1] = now_ns();
			n_cmp_slow++;
		}

	}
	return (x > y) - (x < y);
}

extern "C" NOINLINE void sort_fn(void)
{
	uint64_t t0 = now_ns();
	int v[64];
	for (int i = 0; i < 64; i++)
		v[i] = (i * 37) % 64;
	n_cmp_slow = 0;
	qsort(v, 64, sizeof(int), cmp_fn);
	uint64_t t1 = now_ns();
	for (int i = 0; i < n_cmp_slow; i++) {
		note("cmp_fn", cmp_slow[i][0], cmp_slow[i][1]);
		emit("cmp_fn", t0, t1);
	}
	note("sort_fn", t0, t1);
}

static void mode_libcalls()
{
	for (int i = 0; i < 3; i++)
		CALL("sort_fn", sort_fn());
}

// ---- thread churn ------------------------------------------------------------------------

extern "C" NOINLINE void churn_fn(void)
{
	uint64_t t0 = now_ns();
	sleep_ns(1000000);
	note("churn_fn", t0, now_ns());
}

static void *churn_thread(void *)
{
	CALL("churn_fn", churn_fn());
	return nullptr;
}

static void mode_churn()
{
	for (int i = 0; i < 1000; i += 10) {
		pthread_t th[10];
		for (int j = 0; j < 10; j++)
			pthread_create(&th[j], nullptr, churn_thread, nullptr);
		for (int j = 0; j < 10; j++)
			pthread_join(th[j], nullptr);
	}
}

// ---- signal handlers -------------------------------------------------------------------

static volatile int handled;
extern "C" NOINLINE void handler_fn(void)
{
	uint64_t t0 = clock_raw();
	spin_until(t0 + 2000000);
	note("handler_fn", t0, clock_raw());
	handled++;
}

static void on_alarm(int)
{
	uint64_t t0 = clock_raw();
	handler_fn();
	emit("handler_fn", t0, clock_raw());
}

static void mode_signals()
{
	struct sigaction sa;
	memset(&sa, 0, sizeof(sa));
	sa.sa_handler = on_alarm;
	sigaction(SIGALRM, &sa, nullptr);
	struct itimerval it = {{0, 20000}, {0, 20000}};
	setitimer(ITIMER_REAL, &it, nullptr);
	uint64_t end = now_ns() + 1000000000ull, acc = 0;
	while (now_ns() < end)
		for (int i = 0; i < 100; i++)
			acc += tiny_fn(acc);
	struct itimerval off = {{0, 0}, {0, 0}};
	setitimer(ITIMER_REAL, &off, nullptr);
	CALL("sleep_fn", sleep_fn(3000000));
	note("acc", acc, (uint64_t)handled);
}

// ---- C++ exceptions and longjmp through instrumented frames --------------------------------

extern "C" NOINLINE void throw_deep(int n)
{
	if (n == 0)
		throw std::runtime_error("unwind");
	throw_deep(n - 1);
	handled++;
}

static jmp_buf jb;
extern "C" NOINLINE void jump_deep(int n)
{
	if (n == 0)
		longjmp(jb, 1);
	jump_deep(n - 1);
	handled++;
}

extern "C" NOINLINE void after_unwind_fn(void)
{
	uint64_t t0 = now_ns();
	sleep_ns(3000000);
	note("after_unwind_fn", t0, now_ns());
}

extern "C" NOINLINE void unwind_fn(void)
{
	for (int i = 0; i < 5; i++) {
		try {
			throw_deep(4);
		} catch (const std::exception &) {
		}
		CALL("after_unwind_fn", after_unwind_fn());
		if (setjmp(jb) == 0)
			jump_deep(4);
		CALL("after_unwind_fn", after_unwind_fn());
	}
}

// ---- a stack deeper than the shadow stack ------------------------------------------------

extern "C" NOINLINE int deep_fn(int n)
{
	uint64_t t0 = now_ns();
	int r = 0;
	if (n == 151)
		CALL("deep_fn", r = deep_fn(n - 1) + 1);
	else if (n > 0)
		r = deep_fn(n - 1) + 1;
	if (n == 0)
		sleep_ns(5000000);
	if (n == 150) // depth ~50: stored, so timed
		note("deep_fn", t0, now_ns());
	return r;
}

static void mode_deep()
{
	for (int i = 0; i < 3; i++)
		deep_fn(200);
}

int main(int argc, char **argv)
{
	if (argc < 3) {
		fprintf(stderr, "usage: ldbtarget MODE TRUTH_FILE\n");
		return 2;
	}
	truth = fopen(argv[2], "w");
	if (!truth) {
		perror(argv[2]);
		return 1;
	}
	usleep(300000); // let the agent attach its observer
	const char *mode = argv[1];
	if (!strcmp(mode, "durations"))
		mode_durations();
	else if (!strcmp(mode, "recursion"))
		mode_recursion();
	else if (!strcmp(mode, "short"))
		mode_short();
	else if (!strcmp(mode, "libcalls"))
		mode_libcalls();
	else if (!strcmp(mode, "churn"))
		mode_churn();
	else if (!strcmp(mode, "signals"))
		mode_signals();
	else if (!strcmp(mode, "unwind"))
		unwind_fn();
	else if (!strcmp(mode, "deep"))
		mode_deep();
	else {
		fprintf(stderr, "unknown mode %s\n", mode);
		return 2;
	}
	usleep(100000); // let the observer see the last returns
	fclose(truth);
	return 0;
}
