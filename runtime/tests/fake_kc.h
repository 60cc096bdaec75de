/* fake_kc.h — a stand-in for the agent's kernel-counter map, for tests and
 * benchmarks: a real BPF_F_MMAPABLE array made with raw bpf(), pinned at a
 * private path, with a live header. The caller plays BPF by writing
 * entries (fake_kc_add). Header-only; include from one file. */
#ifndef TS_FAKE_KC_H
#define TS_FAKE_KC_H

#include <dirent.h>
#include <linux/bpf.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "tailscope/abi.h"

extern const char *ts_kc_pin_path; /* libtailscope internal */

static char fake_kc_path[64];

static inline long fake_bpf(int cmd, union bpf_attr *a)
{
	return syscall(__NR_bpf, cmd, a, sizeof(*a));
}

/* Create, map and pin at path, as agent `agent` would. NULL if bpf() fails. */
static inline struct ts_kcounters *fake_kc_create_at(const char *path, __u32 agent)
{
	union bpf_attr a;
	memset(&a, 0, sizeof(a));
	a.map_type = BPF_MAP_TYPE_ARRAY;
	a.key_size = 4;
	a.value_size = TS_KC_ENTRY_SIZE;
	a.max_entries = TS_KC_ENTRIES;
	a.map_flags = BPF_F_MMAPABLE;
	int fd = (int)fake_bpf(BPF_MAP_CREATE, &a);
	if (fd < 0)
		return NULL;
	void *p = mmap(NULL, (size_t)TS_KC_ENTRIES * TS_KC_ENTRY_SIZE, PROT_READ | PROT_WRITE,
	               MAP_SHARED, fd, 0);
	if (p == MAP_FAILED) {
		close(fd);
		return NULL;
	}
	struct ts_kc_header *h = p;
	h->magic = TS_ABI_MAGIC;
	h->abi_version = TS_ABI_VERSION;
	h->entry_size = TS_KC_ENTRY_SIZE;
	h->entries = TS_KC_ENTRIES;
	h->agent_pid = agent;
	h->live = 1;
	unlink(path);
	memset(&a, 0, sizeof(a));
	a.pathname = (__u64)(unsigned long)path;
	a.bpf_fd = (__u32)fd;
	long rc = fake_bpf(BPF_OBJ_PIN, &a);
	close(fd);
	if (rc != 0) {
		munmap(p, (size_t)TS_KC_ENTRIES * TS_KC_ENTRY_SIZE);
		return NULL;
	}
	return p;
}

/* Create, map and pin at a test path; point the runtime at it. */
static inline struct ts_kcounters *fake_kc_create(void)
{
	snprintf(fake_kc_path, sizeof(fake_kc_path),
	         "/sys/fs/bpf/tailscope-test-kc-%d" /* bpffs rejects dots */, (int)getpid());
	struct ts_kcounters *p = fake_kc_create_at(fake_kc_path, (__u32)getpid());
	if (p)
		ts_kc_pin_path = fake_kc_path;
	return p;
}

/* Point the runtime at some running agent's real array (any agent's: the
 * caller is not its target, so nothing is counted, but mapping and claiming
 * entries are real). Returns 0 if no agent is running. */
static inline int use_any_agent_kc(void)
{
	static char path[300];
	DIR *d = opendir(TS_KC_PIN_DIR);
	int found = 0;
	for (struct dirent *e; d && !found && (e = readdir(d));) {
		if (strncmp(e->d_name, "kcounters-", 10) != 0)
			continue;
		snprintf(path, sizeof(path), "%s/%s", TS_KC_PIN_DIR, e->d_name);
		/* only a live agent's (a dead one's may linger until the next load) */
		union bpf_attr a;
		memset(&a, 0, sizeof(a));
		a.pathname = (__u64)(unsigned long)path;
		int fd = (int)fake_bpf(BPF_OBJ_GET, &a);
		if (fd < 0)
			continue;
		struct ts_kc_header h;
		__u32 key = 0;
		memset(&a, 0, sizeof(a));
		a.map_fd = (__u32)fd;
		a.key = (__u64)(unsigned long)&key;
		a.value = (__u64)(unsigned long)&h;
		found = fake_bpf(BPF_MAP_LOOKUP_ELEM, &a) == 0 && h.live == 1 &&
		        kill((pid_t)h.agent_pid, 0) == 0;
		close(fd);
	}
	if (d)
		closedir(d);
	if (found)
		ts_kc_pin_path = path;
	return found;
}

static inline void fake_kc_destroy(struct ts_kcounters *kc)
{
	((struct ts_kc_header *)kc)->live = 0;
	unlink(fake_kc_path);
}

/* Find tid's entry the way BPF would (claim if free). */
static inline struct ts_kcounters *fake_kc_entry(struct ts_kcounters *kc, __u32 tid)
{
	for (__u32 i = 0; i < TS_KC_PROBE; i++) {
		__u32 idx = (tid + i) & (TS_KC_ENTRIES - 1), zero = 0;
		if (!idx)
			continue;
		if (kc[idx].tid == tid ||
		    __atomic_compare_exchange_n(&kc[idx].tid, &zero, tid, 0, __ATOMIC_ACQ_REL,
		                                __ATOMIC_RELAXED))
			return &kc[idx];
	}
	return NULL;
}

/* Play BPF: add to an entry under its seqlock. */
static inline void fake_kc_add(struct ts_kcounters *e, __u64 runnable_ns, __u64 irq_ns,
                               __u32 faults)
{
	__atomic_fetch_add(&e->seq, 1, __ATOMIC_ACQ_REL);
	e->runnable_ns += runnable_ns;
	e->runnable_count += runnable_ns != 0;
	e->irq_ns += irq_ns;
	e->irq_count += irq_ns != 0;
	e->fault_user_count += faults;
	__atomic_fetch_add(&e->seq, 1, __ATOMIC_ACQ_REL);
}

#endif /* TS_FAKE_KC_H */
