/* toy.c — the LDB Fig. 3.1 example (breakwater-ldb-thesis.txt ch. 3).
 *
 * A foreground thread handles requests: each takes a global lock, stores a
 * value in a small table and computes a fresh random string. A background
 * thread calls snapshot() every 10 ms, which holds the same lock for about
 * 10 ms while it writes the table to a file and fsyncs it — mostly blocked
 * on I/O, so a CPU profiler gives it a sliver of samples, yet it is what
 * makes the slow requests slow.
 *
 *   usage: toy SECONDS [snapshot-ms]
 *
 * Requests are marked with libtailscope (tailscope_request_begin/end), and
 * the request ids are handed to REQ_START/REQ_END too. Build with
 * -finstrument-functions (tests/ldb/Makefile).
 */
#define _GNU_SOURCE
#include <fcntl.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "tailscope/tailscope.h"

#define DB_SIZE 4096
#define VALUE_LEN 64

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static char db[DB_SIZE][VALUE_LEN];
static volatile int stop;
static int snapshot_ms = 10;

static uint64_t now_ns(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

__attribute__((noinline)) void write_out(int fd)
{
	/* Write the table and wait for it to reach the disk. */
	for (int i = 0; i < DB_SIZE; i += 256) {
		if (write(fd, db[i], 256 * VALUE_LEN) < 0)
			break;
	}
	fdatasync(fd);
}

__attribute__((noinline)) void snapshot(void)
{
	pthread_mutex_lock(&lock);
	int fd = open("/tmp/tailscope-toy-snapshot", O_WRONLY | O_CREAT | O_TRUNC, 0600);
	if (fd >= 0) {
		write_out(fd);
		close(fd);
	}
	/* Hold the lock for snapshot_ms in all, like the paper's snapshot. */
	uint64_t until = now_ns() + (uint64_t)snapshot_ms * 1000000ull;
	while (now_ns() < until)
		usleep(500);
	pthread_mutex_unlock(&lock);
}

static void *background_thread(void *arg)
{
	(void)arg;
	while (!stop) {
		snapshot();
		usleep(10000);
	}
	return NULL;
}

__attribute__((noinline)) void generate_random_string(char *out, unsigned *seed)
{
	for (int i = 0; i < VALUE_LEN - 1; i++)
		out[i] = (char)('a' + rand_r(seed) % 26);
	out[VALUE_LEN - 1] = '\0';
}

__attribute__((noinline)) void request_handler(int key, const char *value)
{
	pthread_mutex_lock(&lock);
	memcpy(db[key], value, VALUE_LEN);
	pthread_mutex_unlock(&lock);
}

int main(int argc, char **argv)
{
	double seconds = argc > 1 ? atof(argv[1]) : 2.0;
	if (argc > 2)
		snapshot_ms = atoi(argv[2]);
	pthread_t bg;
	pthread_create(&bg, NULL, background_thread, NULL);
	unsigned seed = 1;
	char value[VALUE_LEN];
	uint64_t end = now_ns() + (uint64_t)(seconds * 1e9), id = 0;
	while (now_ns() < end) {
		id++;
		tailscope_request_begin(id);
		tailscope_req_start(id, NULL);
		generate_random_string(value, &seed);
		request_handler(rand_r(&seed) % DB_SIZE, value);
		tailscope_req_end(id);
		tailscope_request_end(id);
		usleep(200); /* about 4k requests per second */
	}
	stop = 1;
	pthread_join(bg, NULL);
	printf("%llu requests\n", (unsigned long long)id);
	return 0;
}
