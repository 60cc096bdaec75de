/* region.c — the per-process shared-memory region and its lifecycle.
 *
 * At load time (a constructor, or the first API call if another
 * constructor gets there first) the runtime reads its environment and
 * creates /dev/shm/tailscope.<pid>: a struct ts_region_header followed by
 * TS_MAX_SLOTS thread slots. The file is ftruncate'd (sparse; pages appear
 * only when a thread touches its slot) and mapped MAP_SHARED. The header
 * is filled in and `magic` is store-released last, so an agent that sees
 * the magic sees a complete header.
 *
 * Lifecycle (what the agent can rely on):
 *   - exit: a destructor unlinks the file. The agent keeps its own mapping,
 *     so it can still drain the rings; it learns of the exit from the pid.
 *     A process killed without running destructors leaves a stale file; the
 *     agent removes files whose pid no longer exists.
 *   - fork: the child drops the parent's mapping and creates its own region
 *     for its new pid, copying the kind table (callers cache kind ids).
 *   - failure anywhere: the runtime disables itself; TAILSCOPE_DEBUG=1 says
 *     why. The service is never affected.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include "internal.h"
#include "tailscope/tailscope.h"

struct ts_process ts_proc = {
    .kind_lock = PTHREAD_MUTEX_INITIALIZER,
    .kc_lock = PTHREAD_MUTEX_INITIALIZER,
    .ldb_dead_hb = UINT64_MAX,
};
static pthread_once_t ts_once = PTHREAD_ONCE_INIT;

void ts_debug(const char *fmt, ...)
{
	if (!ts_proc.debug)
		return;
	char buf[256];
	va_list ap;
	va_start(ap, fmt);
	int n = vsnprintf(buf, sizeof(buf), fmt, ap);
	va_end(ap);
	if (n < 0)
		return;
	if ((size_t)n >= sizeof(buf))
		n = sizeof(buf) - 1;
	dprintf(2, "tailscope[%d]: %.*s\n", (int)getpid(), n, buf);
}

uint64_t ts_now_ns(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static int env_is_one(const char *name)
{
	const char *v = getenv(name);
	return v && v[0] == '1' && v[1] == '\0';
}

/* "0.01" -> 10000, "1%" -> 10000, "250ppm" / "250" -> 250, "1" -> 1000000.
 * Anything unparsable gives `dflt`. */
uint32_t ts_parse_sample(const char *s, uint32_t dflt)
{
	if (!s || !*s)
		return dflt;
	char *end;
	double v = strtod(s, &end);
	if (end == s || v < 0)
		return dflt;
	double ppm;
	if (strcmp(end, "%") == 0)
		ppm = v * 10000.0;
	else if (strcmp(end, "ppm") == 0)
		ppm = v;
	else if (*end != '\0')
		return dflt;
	else if (strchr(s, '.') || v <= 1.0)
		ppm = v * 1e6;
	else
		ppm = v;
	if (ppm > TS_PPM)
		ppm = TS_PPM;
	return (uint32_t)(ppm + 0.5);
}

/* Create, size and map the region for the current pid, and fill in its
 * header. Returns 0 on success; on failure leaves ts_proc disabled. */
static int region_create(void)
{
	int pid = (int)getpid();
	size_t size =
	    sizeof(struct ts_region_header) + (size_t)TS_MAX_SLOTS * sizeof(struct ts_thread_slot);
	snprintf(ts_proc.path, sizeof(ts_proc.path), TS_REGION_PATH_FMT, pid);
	int fd = open(ts_proc.path, O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
	if (fd < 0) {
		ts_debug("disabled: open %s: %s", ts_proc.path, strerror(errno));
		return -1;
	}
	if (ftruncate(fd, (off_t)size) != 0) {
		ts_debug("disabled: ftruncate %s: %s", ts_proc.path, strerror(errno));
		close(fd);
		unlink(ts_proc.path);
		return -1;
	}
	void *p = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	close(fd);
	if (p == MAP_FAILED) {
		ts_debug("disabled: mmap %s: %s", ts_proc.path, strerror(errno));
		unlink(ts_proc.path);
		return -1;
	}
	struct ts_region_header *h = p;
	h->abi_version = TS_ABI_VERSION;
	h->header_size = sizeof(struct ts_region_header);
	h->slot_size = sizeof(struct ts_thread_slot);
	h->max_slots = TS_MAX_SLOTS;
	h->ring_capacity = TS_RING_CAPACITY;
	h->record_size = sizeof(struct ts_request_record);
	h->shadow_depth = TS_SHADOW_DEPTH;
	h->event_ring_capacity = TS_EVENT_RING_CAPACITY;
	h->pid = (uint32_t)pid;
	h->sample_ppm_runtime = ts_proc.sample_ppm;
	h->created_ns = ts_now_ns();
	h->features = TS_FEAT_SNAP_GUARD;
	__atomic_store_n(&h->magic, TS_ABI_MAGIC, __ATOMIC_RELEASE);

	ts_proc.hdr = h;
	ts_proc.slots = (struct ts_thread_slot *)(h + 1);
	ts_proc.region_size = size;
	ts_proc.pid = pid;
	ts_proc.enabled = 1;
	ts_debug("region %s (%zu bytes, sample %u ppm)", ts_proc.path, size, ts_proc.sample_ppm);
	return 0;
}

/* pthread_atfork handlers: keep the kind table consistent across fork,
 * and give the child its own region. */
static void fork_prepare(void)
{
	pthread_mutex_lock(&ts_proc.kind_lock);
}
static void fork_parent(void)
{
	pthread_mutex_unlock(&ts_proc.kind_lock);
}

static void fork_child(void)
{
	pthread_mutex_init(&ts_proc.kind_lock, NULL);
	pthread_mutex_init(&ts_proc.kc_lock, NULL);
	ts_thread_reset_after_fork(&ts_self);
	if (!ts_proc.enabled)
		return;

	struct ts_region_header *old = ts_proc.hdr;
	size_t old_size = ts_proc.region_size;
	ts_proc.enabled = 0;
	ts_proc.hdr = NULL;
	ts_proc.slots = NULL;
	if (region_create() == 0) {
		uint32_t n = old->kinds_count;
		if (n >= TS_MAX_KINDS)
			n = TS_MAX_KINDS - 1;
		memcpy(ts_proc.hdr->kinds, old->kinds, sizeof(old->kinds));
		ts_proc.hdr->features = old->features & (TS_FEAT_LOCK_SHIM | TS_FEAT_SNAP_GUARD);
		__atomic_store_n(&ts_proc.hdr->kinds_count, n, __ATOMIC_RELEASE);
	}
	munmap(old, old_size); /* the child has one thread: nobody else uses it */
}

static void process_init(void)
{
	ts_proc.debug = env_is_one("TAILSCOPE_DEBUG");
	if (env_is_one("TAILSCOPE_DISABLE")) {
		ts_debug("disabled by TAILSCOPE_DISABLE");
		return;
	}
	ts_proc.sample_ppm = ts_parse_sample(getenv("TAILSCOPE_SAMPLE"), TS_DEFAULT_SAMPLE_PPM);
	ts_proc.fn_clock = env_is_one("TAILSCOPE_FN_CLOCK");
	if (pthread_key_create(&ts_proc.key, ts_slot_exit) != 0) {
		ts_debug("disabled: pthread_key_create failed");
		return;
	}
	if (region_create() != 0)
		return;
	pthread_atfork(fork_prepare, fork_parent, fork_child);
}

/* Initialise the process once; returns 1 if the runtime is enabled. */
int ts_process_ready(void)
{
	pthread_once(&ts_once, process_init);
	return ts_proc.enabled;
}

__attribute__((constructor)) static void ts_constructor(void)
{
	ts_process_ready();
}

/* Unlink (not unmap: other threads may still be recording) at exit. */
__attribute__((destructor)) static void ts_destructor(void)
{
	if (ts_proc.enabled && ts_proc.pid == (int)getpid()) {
		unlink(ts_proc.path);
		ts_debug("unlinked %s", ts_proc.path);
	}
}

int tailscope_kind(const char *name)
{
	if (!name || !*name || !ts_process_ready())
		return 0;
	struct ts_region_header *h = ts_proc.hdr;
	int id = 0;
	pthread_mutex_lock(&ts_proc.kind_lock);
	uint32_t n = h->kinds_count;
	for (uint32_t i = 1; i <= n && i < TS_MAX_KINDS; i++) {
		if (strncmp(h->kinds[i], name, TS_KIND_NAME_LEN - 1) == 0) {
			id = (int)i;
			break;
		}
	}
	if (id == 0 && n + 1 < TS_MAX_KINDS) {
		id = (int)(n + 1);
		strncpy(h->kinds[id], name, TS_KIND_NAME_LEN - 1);
		h->kinds[id][TS_KIND_NAME_LEN - 1] = '\0';
		__atomic_store_n(&h->kinds_count, n + 1, __ATOMIC_RELEASE);
	}
	pthread_mutex_unlock(&ts_proc.kind_lock);
	if (id == 0)
		ts_debug("kind table full, \"%s\" is unnamed", name);
	return id;
}

int tailscope_enabled(void)
{
	return ts_process_ready();
}

const char *tailscope_region_path(void)
{
	return ts_process_ready() ? ts_proc.path : NULL;
}
