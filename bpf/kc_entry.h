/* kc_entry.h — the kernel-counter array as seen from BPF.
 *
 * Shared by kcounters.bpf.c (which accumulates into entries) and
 * infer.bpf.c (which snapshots them). Both objects declare the same two
 * maps; the loader creates them once (kcounters object) and hands the same
 * fds to the infer object (bpf_map__reuse_fd), so there is one array and
 * one target set.
 *
 * An entry is found by hashing the tid, as abi.h specifies:
 *     idx(tid, i) = (tid + i) & (TS_KC_ENTRIES - 1), i < TS_KC_PROBE, idx != 0
 * and claimed with a compare-and-swap of entry.tid from 0 to tid. The
 * runtime may claim first; either way entry.tid == tid afterwards.
 */
#ifndef TAILSCOPE_KC_ENTRY_H
#define TAILSCOPE_KC_ENTRY_H

#include <tailscope/abi.h>

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(map_flags, BPF_F_MMAPABLE);
	__uint(max_entries, TS_KC_ENTRIES);
	__type(key, __u32);
	__type(value, struct ts_kcounters);
} kcounters SEC(".maps");

/* tgid -> 1 for processes whose threads are accounted. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 4096);
	__type(key, __u32);
	__type(value, __u8);
} targets SEC(".maps");

/* A cheap pre-filter in front of `targets`: bucket tgid % TS_TGID_BUCKETS
 * is nonzero if some target may hash there. Array lookups are inlined by
 * the verifier (no helper call), so the hot paths that run for every
 * process (irq exits, socket calls, faults) reject non-targets with one
 * load. Buckets are set by the loader and the fork handler, and never
 * cleared (a stale bucket only costs the exact lookup). */
#define TS_TGID_BUCKETS 4096
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, TS_TGID_BUCKETS);
	__type(key, __u32);
	__type(value, __u32);
} target_buckets SEC(".maps");

static __always_inline bool maybe_target_tgid(__u32 tgid)
{
	__u32 b = tgid & (TS_TGID_BUCKETS - 1);
	__u32 *v = bpf_map_lookup_elem(&target_buckets, &b);

	return v && *v;
}

static __always_inline bool is_target_tgid(__u32 tgid)
{
	return tgid && maybe_target_tgid(tgid) && bpf_map_lookup_elem(&targets, &tgid);
}

static __always_inline void mark_target_bucket(__u32 tgid)
{
	__u32 b = tgid & (TS_TGID_BUCKETS - 1);
	__u32 *v = bpf_map_lookup_elem(&target_buckets, &b);

	if (v)
		*v = 1;
}

static __always_inline void count_collision(void)
{
	__u32 zero = 0;
	struct ts_kc_header *h = bpf_map_lookup_elem(&kcounters, &zero);

	if (h)
		__sync_fetch_and_add(&h->collisions, 1);
}

/* The thread's entry and its index, or NULL; never claims. */
static __always_inline struct ts_kcounters *kc_find(__u32 tid, __u32 *idx_out)
{
	if (!tid)
		return NULL;
	for (__u32 i = 0; i < TS_KC_PROBE; i++) {
		__u32 idx = (tid + i) & (TS_KC_ENTRIES - 1);
		struct ts_kcounters *e;

		if (!idx)
			continue;
		e = bpf_map_lookup_elem(&kcounters, &idx);
		if (!e)
			return NULL;
		if (e->tid == tid) {
			*idx_out = idx;
			return e;
		}
	}
	return NULL;
}

/* The thread's entry, or NULL. With claim, take a free slot if the thread
 * has none (and count a collision when all TS_KC_PROBE slots are taken). */
static __always_inline struct ts_kcounters *kc_entry(__u32 tid, __u32 tgid, bool claim)
{
	struct ts_kcounters *found;
	__u32 found_idx;

	if (!tid)
		return NULL;
	found = kc_find(tid, &found_idx);
	if (found || !claim)
		return found;
	/* Claim the first free slot. A slot another thread takes first is
	 * passed over; one the runtime claimed for this thread meanwhile
	 * (old == tid) is this thread's. */
	for (__u32 i = 0; i < TS_KC_PROBE; i++) {
		__u32 idx = (tid + i) & (TS_KC_ENTRIES - 1);
		struct ts_kcounters *e;

		if (!idx)
			continue;
		e = bpf_map_lookup_elem(&kcounters, &idx);
		if (!e)
			return NULL;
		if (e->tid == tid)
			return e;
		if (!e->tid) {
			__u32 old = __sync_val_compare_and_swap(&e->tid, 0, tid);

			if (old == 0 || old == tid) {
				e->tgid = tgid;
				return e;
			}
		}
	}
	count_collision();
	return NULL;
}

/* Seqlock around every update: odd while BPF writes. */
static __always_inline void kc_write_begin(struct ts_kcounters *e)
{
	__sync_fetch_and_add(&e->seq, 1);
}

static __always_inline void kc_write_end(struct ts_kcounters *e)
{
	__sync_fetch_and_add(&e->seq, 1);
}

#endif /* TAILSCOPE_KC_ENTRY_H */
