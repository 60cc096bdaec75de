/* kcounters.c — this thread's entry in the agent's kernel-counter array.
 *
 * Each agent pins a BPF_F_MMAPABLE array at TS_KC_PIN_PREFIX<its pid>; the
 * region header's agent_pid says which agent is this process's. Its eBPF
 * programs add each thread's on-CPU time, waits, irq/softirq time, faults
 * and switches into the thread's entry. The runtime maps the array (raw
 * bpf(BPF_OBJ_GET) + mmap, no libbpf) the first time a sampled request
 * begins while an agent is attached, finds the thread's entry by hashing
 * its tid (claiming a free one by CAS of tid 0 -> tid), and snapshots it
 * under the entry's seqlock at request begin and end.
 *
 * Failed opens are retried at most every TS_KC_RETRY_NS. When the agent
 * exits it clears `live` in entry 0; the runtime then forgets the mapping
 * and opens the new one when an agent comes back (so it does when another
 * agent takes over the region). A forgotten mapping is not unmapped
 * (another thread may be mid-snapshot): it is replaced in place by
 * anonymous zero pages, which releases the agent's array (8 MiB of kernel
 * memory) while its addresses stay readable; a snapshot that reads zeros
 * finds no entry and the request keeps no counters. Each replaced mapping
 * keeps 8 MiB of address space and no memory, so a process can be recorded
 * TS_KC_MAX_MAPS times.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <linux/bpf.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "internal.h"

#define TS_KC_RETRY_NS 100000000ull /* 100 ms */
#define TS_KC_MAX_MAPS 4096         /* 32 GiB of address space, no memory */
#define TS_KC_MAP_SIZE ((size_t)TS_KC_ENTRIES * TS_KC_ENTRY_SIZE)

_Static_assert(sizeof(struct ts_kcounters) == TS_KC_ENTRY_SIZE, "kc entry");
_Static_assert(sizeof(struct ts_kc_header) == TS_KC_ENTRY_SIZE, "kc header");

/* Tests and benchmarks that link the static library point this at a map
 * they made themselves (hidden, not an API). NULL: the agent's own pin. */
const char *ts_kc_pin_path TS_HIDDEN = NULL;

static struct ts_kc_header *kc_header(struct ts_kcounters *kc)
{
	return (struct ts_kc_header *)kc;
}

static int kc_header_ok(struct ts_kc_header *h)
{
	return h->magic == TS_ABI_MAGIC && h->abi_version == TS_ABI_VERSION &&
	       h->entry_size == TS_KC_ENTRY_SIZE && h->entries == TS_KC_ENTRIES &&
	       __atomic_load_n(&h->live, __ATOMIC_ACQUIRE) == 1;
}

static int kc_obj_get(const char *path)
{
	union bpf_attr attr;
	memset(&attr, 0, sizeof(attr));
	attr.pathname = (uint64_t)(uintptr_t)path;
	int fd = (int)syscall(__NR_bpf, BPF_OBJ_GET, &attr, sizeof(attr));
	if (fd < 0)
		ts_debug("kcounters: BPF_OBJ_GET %s: %s", path, strerror(errno));
	return fd;
}

/* Open and map agent's pinned array. Called under kc_lock. */
static struct ts_kcounters *kc_map_open(uint32_t agent)
{
	char path[sizeof(TS_KC_PIN_PREFIX) + 16];
	int fd;
	if (ts_kc_pin_path) {
		fd = kc_obj_get(ts_kc_pin_path);
	} else {
		snprintf(path, sizeof(path), TS_KC_PIN_PREFIX "%u", agent);
		fd = kc_obj_get(path);
	}
	if (fd < 0)
		return NULL;
	void *p = mmap(NULL, TS_KC_MAP_SIZE, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	close(fd);
	if (p == MAP_FAILED) {
		ts_debug("kcounters: mmap: %s", strerror(errno));
		return NULL;
	}
	if (!kc_header_ok(p)) {
		ts_debug("kcounters: bad header (magic/version/size or not live)");
		munmap(p, TS_KC_MAP_SIZE);
		return NULL;
	}
	ts_debug("kcounters: mapped the array of agent %u", agent);
	return p;
}

/* A mapping serves while its agent is alive (live: an agent that exits
 * clears it, and one that loads removes a dead agent's pin only after
 * clearing it) and is the region's agent: the array's own header names it,
 * fixed for the mapping's life. Tests that pin an array of their own
 * (ts_kc_pin_path) are not checked against the region. */
static int kc_usable(struct ts_kcounters *kc, uint32_t agent)
{
	return __atomic_load_n(&kc_header(kc)->live, __ATOMIC_RELAXED) &&
	       (ts_kc_pin_path || kc_header(kc)->agent_pid == agent);
}

/* Make ts_proc.kc a live mapping of the attached agent's array if we can,
 * without ever blocking. */
static struct ts_kcounters *kc_current(uint64_t now)
{
	struct ts_kcounters *kc = __atomic_load_n(&ts_proc.kc, __ATOMIC_ACQUIRE);
	uint32_t agent = __atomic_load_n(&ts_proc.hdr->agent_pid, __ATOMIC_RELAXED);
	if (TS_LIKELY(kc && kc_usable(kc, agent)))
		return kc;
	if (now < __atomic_load_n(&ts_proc.kc_next_try_ns, __ATOMIC_RELAXED) ||
	    ts_proc.kc_maps >= TS_KC_MAX_MAPS)
		return NULL;
	if (pthread_mutex_trylock(&ts_proc.kc_lock) != 0)
		return NULL;
	/* Again under the lock: another thread may have moved on already. */
	agent = __atomic_load_n(&ts_proc.hdr->agent_pid, __ATOMIC_RELAXED);
	kc = ts_proc.kc;
	if (kc && !kc_usable(kc, agent)) {
		ts_debug("kcounters: agent gone or replaced (live=%u, array of %u, region's %u), "
		         "releasing mapping",
		         kc_header(kc)->live, kc_header(kc)->agent_pid, agent);
		__atomic_store_n(&ts_proc.kc, NULL, __ATOMIC_RELEASE);
		if (mmap(kc, TS_KC_MAP_SIZE, PROT_READ | PROT_WRITE,
		         MAP_FIXED | MAP_PRIVATE | MAP_ANONYMOUS, -1, 0) == MAP_FAILED)
			ts_debug("kcounters: cannot release mapping: %s", strerror(errno));
		kc = NULL;
	}
	if (!kc) {
		kc = kc_map_open(agent);
		if (kc)
			ts_proc.kc_maps++;
		else
			__atomic_store_n(&ts_proc.kc_next_try_ns, now + TS_KC_RETRY_NS,
			                 __ATOMIC_RELAXED);
		__atomic_store_n(&ts_proc.kc, kc, __ATOMIC_RELEASE);
	}
	pthread_mutex_unlock(&ts_proc.kc_lock);
	return kc;
}

/* Find this thread's entry, claiming a free one if none has its tid. */
static uint32_t kc_find(struct ts_kcounters *kc, uint32_t tid)
{
	const uint32_t mask = TS_KC_ENTRIES - 1;
	for (uint32_t i = 0; i < TS_KC_PROBE; i++) {
		uint32_t idx = (tid + i) & mask;
		if (idx && __atomic_load_n(&kc[idx].tid, __ATOMIC_RELAXED) == tid)
			return idx;
	}
	for (uint32_t i = 0; i < TS_KC_PROBE; i++) {
		uint32_t idx = (tid + i) & mask, zero = 0;
		if (!idx)
			continue;
		if (__atomic_compare_exchange_n(&kc[idx].tid, &zero, tid, 0, __ATOMIC_ACQ_REL,
		                                __ATOMIC_RELAXED) ||
		    zero == tid)
			return idx;
	}
	return 0;
}

/* At a sampled begin: make sure t->kc_idx names this thread's entry in the
 * live mapping. Returns 1 if it does. */
int ts_kc_begin(struct ts_thread *t, uint64_t now)
{
	struct ts_kcounters *kc = kc_current(now);
	if (!kc) {
		t->kc_idx = 0;
		return 0;
	}
	if (t->kc_map != kc || !t->kc_idx ||
	    __atomic_load_n(&kc[t->kc_idx].tid, __ATOMIC_RELAXED) != t->tid) {
		t->kc_map = kc;
		t->kc_idx = kc_find(kc, t->tid);
	}
	return t->kc_idx != 0;
}

/* Seqlock-read this thread's entry. The thread is running, so its open
 * on-CPU interval (since switch_in_ns) is added in. ~25 instructions when
 * the first read is clean, which is the norm: the entry is only written
 * by BPF in contexts that interrupt or switch out this very thread. */
int ts_kc_snapshot(struct ts_thread *t, uint64_t now, struct ts_kc_snap *s)
{
	if (!t->kc_idx || !t->kc_map || !kc_header(t->kc_map)->live)
		return TS_SNAP_NONE;
	volatile struct ts_kcounters *e = &t->kc_map[t->kc_idx];
	uint64_t switch_in = 0;
	int tries;
	for (tries = 0; tries < 4; tries++) {
		uint32_t s1 = __atomic_load_n(&e->seq, __ATOMIC_ACQUIRE);
		s->oncpu_ns = e->oncpu_ns;
		switch_in = e->switch_in_ns;
		s->runnable_ns = e->runnable_ns;
		s->blocked_ns = e->blocked_ns;
		s->irq_ns = e->irq_ns;
		s->softirq_ns = e->softirq_ns;
		s->counts[0] = e->runnable_count;
		s->counts[1] = e->blocked_count;
		s->counts[2] = e->irq_count;
		s->counts[3] = e->softirq_count;
		s->counts[4] = e->fault_user_count;
		s->counts[5] = e->fault_kernel_count;
		s->counts[6] = e->migrations;
		s->counts[7] = e->vol_switches;
		s->counts[8] = e->invol_switches;
		__atomic_thread_fence(__ATOMIC_ACQUIRE);
		if (!(s1 & 1) && __atomic_load_n(&e->seq, __ATOMIC_RELAXED) == s1)
			break;
	}
	if (e->tid != t->tid)
		return TS_SNAP_NONE;
	/* This thread is running, yet BPF has not seen it switch in since its
	 * entry was claimed or reset: its on-CPU start is unknown (it ran
	 * since before the agent attached, or the scheduler programs were
	 * detached between burst windows). No counters rather than wrong ones
	 * (on-CPU time short by the unseen part). */
	if (!switch_in)
		return TS_SNAP_NONE;
	if (now > switch_in)
		s->oncpu_ns += now - switch_in;
	return tries < 4 ? TS_SNAP_OK : TS_SNAP_TORN;
}
