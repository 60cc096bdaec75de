/* tailscope shared-memory ABI — the one contract between the halves.
 *
 * Three parties read and write what is declared here:
 *   - libtailscope (C, inside the traced service),
 *   - the eBPF programs in bpf/ (kernel side, CO-RE),
 *   - tailscope-agent (Rust, root; crates/abi mirrors these structs and its
 *     layout tests compile this header to pin offsets and sizes).
 *
 * There are two shared regions.
 *
 * 1. The kernel-counter array ("kcounters"). A BPF_F_MMAPABLE array map
 *    created by the agent and pinned at TS_KC_PIN_PREFIX followed by the
 *    agent's pid in decimal (each agent has its own, so several agents
 *    can record different processes at once; the region header's
 *    agent_pid tells the runtime which one is its agent's). The pin is
 *    mode 0600, owned by the one non-root user the agent's targets run as
 *    (root until they are known; followed when a target changes user), so
 *    only the target can open it; targets running as several users leave
 *    it 0666 with a warning. A runtime refused (EACCES) retries. Entry 0 is a
 *    struct ts_kc_header; entries 1..TS_KC_ENTRIES-1 are struct
 *    ts_kcounters, one per traced thread, found by hashing the tid:
 *        idx(tid, i) = (tid + i) & (TS_KC_ENTRIES - 1),  i = 0..TS_KC_PROBE-1,
 *        skipping idx 0.
 *    An entry is claimed by compare-and-swap of its tid from 0 to the tid
 *    (by BPF on the thread's first event, or by the runtime on its first
 *    sampled request, whichever comes first). BPF accumulates the thread's
 *    counters there for as long as the thread lives, under a seqlock
 *    (seq odd while BPF writes). The runtime snapshots an entry at request
 *    begin and end, and records the difference. No syscalls on that path
 *    (but one futex wake when a ring fills while the agent sleeps, below).
 *
 * 2. The per-process region, a file TS_REGION_PATH_FMT (e.g.
 *    /dev/shm/tailscope.1234) created by the runtime and mapped by the
 *    agent. A struct ts_region_header, then max_slots struct ts_thread_slot,
 *    one per thread, each with a single-producer ring of finished
 *    struct ts_request_record. The thread produces (advances ring_head);
 *    the agent consumes (advances ring_tail).
 *
 * 3. LDB (ABI 2), inside each thread slot of the region: a shadow stack
 *    (struct ts_shadow_stack) that -finstrument-functions hooks keep under
 *    a seqlock (gen odd while the owner changes it), scanned by the agent's
 *    observer; and a second single-producer ring of struct ts_event (lock
 *    and request hand-off events), drained by the agent (ev_tail).
 *
 * Everything the agent reads here is written by a process it does not
 * trust: it bounds-checks every index and count, never follows a pointer,
 * and treats a nonsensical value as corruption to be counted, not a crash.
 *
 * Change anything below: bump TS_ABI_VERSION, and update crates/abi and its
 * layout test (crates/abi/tests/layout.rs).
 *
 * Versions: 2 added the LDB shadow stacks and event rings. 3 (same layout,
 * new meaning): shadow-stack pops no longer bump gen (the observer versions
 * a stack by gen and depth); ldb_flags TS_LDB_SLOTS (the observer hands
 * exited slots back); burst_gate (the runtime starts sampled requests only
 * inside the agent's burst windows). A version-2 runtime would ignore the
 * gate and record requests whose counters the agent had stopped keeping.
 * 4 (same layout): each agent pins its own kcounters array at
 * TS_KC_PIN_PREFIX<agent pid> instead of one per machine at
 * .../kcounters; the header's sample_ppm_effective and the agent's
 * heartbeat (agent_heartbeat_ns), from its reserved bytes. A
 * version-3 runtime would look for the old pin and record without
 * counters.
 * 5: drain_futex and drain_waiting, from the reserved bytes: the agent
 * sleeps until a ring is a quarter full (TS_RING_WAKE_FILL) instead of
 * waking every millisecond. A version-4 runtime would never wake it, and
 * its rings would overflow between the agent's (now long) drains.
 */
#ifndef TAILSCOPE_ABI_H
#define TAILSCOPE_ABI_H

#ifndef __VMLINUX_H__
#include <linux/types.h>
#endif

#define TS_ABI_MAGIC 0x3130504f43535354ULL /* "TSSCOP01" little-endian */
#define TS_ABI_VERSION 5

/* ---- 1. kernel-counter array (BPF map, pinned) ------------------------ */

#define TS_KC_PIN_DIR "/sys/fs/bpf/tailscope"
#define TS_KC_PIN_PREFIX "/sys/fs/bpf/tailscope/kcounters-" /* + agent pid (bpffs: no dots) */
#define TS_KC_ENTRIES 65536 /* power of two; entry 0 is the header */
#define TS_KC_PROBE 4       /* linear-probe length for tid hashing */
#define TS_KC_ENTRY_SIZE 128

/* wait_state: what an off-CPU thread is waiting for */
#define TS_WAIT_NONE 0     /* on CPU, or never seen off CPU */
#define TS_WAIT_RUNNABLE 1 /* preempted, or woken and waiting for a CPU */
#define TS_WAIT_BLOCKED 2  /* sleeping / waiting for I/O, not yet woken */

struct ts_kc_header {
	__u64 magic;       /* TS_ABI_MAGIC */
	__u32 abi_version; /* TS_ABI_VERSION */
	__u32 entry_size;  /* TS_KC_ENTRY_SIZE */
	__u32 entries;     /* TS_KC_ENTRIES */
	__u32 agent_pid;   /* agent that owns the map */
	__u32 live;        /* 1 while the agent records; 0 once it exits */
	__u32 _pad0;
	__u64 collisions; /* claims that found no free entry in TS_KC_PROBE */
	__u8 _reserved[88];
};

/* Per-thread cumulative counters, written only by BPF (but claimed by CAS
 * from either side). Lengths in ns of CLOCK_MONOTONIC (bpf_ktime_get_ns). */
struct ts_kcounters {
	__u32 tid;             /* owner; 0 = free */
	__u32 seq;             /* seqlock; odd while BPF updates the entry */
	__u64 oncpu_ns;        /* closed on-CPU intervals (includes irq time) */
	__u64 switch_in_ns;    /* start of the open on-CPU interval; 0 if off CPU */
	__u64 wait_since_ns;   /* start of the open wait, when wait_state != NONE */
	__u32 wait_state;      /* TS_WAIT_* */
	__u32 last_blocked_ns; /* blocked part of the last wait, ending at wait_since_ns when it
	                        * was a wakeup (0: the last wait was a preemption); saturates.
	                        * Lets inference rewind a request's start to its arrival */
	__u64 runnable_ns;     /* preempted or woken, waiting for a CPU */
	__u64 blocked_ns;      /* switched out voluntarily until woken */
	__u64 irq_ns;          /* hard irq + irq_vectors time while this thread was current */
	__u64 softirq_ns;      /* softirq time while this thread was current */
	__u32 runnable_count;
	__u32 blocked_count;
	__u32 irq_count;
	__u32 softirq_count;
	__u32 fault_user_count;
	__u32 fault_kernel_count;
	__u32 migrations;
	__u32 vol_switches;
	__u32 invol_switches;
	__u32 tgid; /* process of the owner (set at claim by BPF; 0 if claimed by runtime first) */
	__u32 sampled_refs; /* open sampled requests of this thread, kept by zero-instrumentation
	                     * inference; a gated agent accounts irq, softirq and fault events
	                     * only while it is nonzero (switches and waits always) */
	__u8 _reserved[12];
};

/* ---- 2. per-process region (/dev/shm) ---------------------------------- */

#define TS_REGION_PATH_FMT "/dev/shm/tailscope.%d"
#define TS_MAX_SLOTS 256             /* threads per process that can record */
#define TS_RING_CAPACITY 512         /* records per thread ring; power of two */
#define TS_RING_WAKE_FILL 128        /* a ring this full wakes a waiting agent */
#define TS_MAX_KINDS 64              /* distinct request kinds per process */
#define TS_KIND_NAME_LEN 24          /* including the NUL */
#define TS_PPM 1000000u              /* sampling rates are parts per million */
#define TS_DEFAULT_SAMPLE_PPM 10000u /* 1% */

/* struct ts_request_record.flags */
#define TS_REC_SAMPLED 0x1  /* chosen by sampling (always set today) */
#define TS_REC_INFERRED 0x2 /* zero-instrumentation: inferred from socket syscalls */
#define TS_REC_COUNTERS 0x4 /* kernel counters valid (kcounters entry found) */
#define TS_REC_TORN 0x8     /* a counter snapshot kept changing; counters best-effort */

/* One finished request. Written by the runtime into its ring, or by BPF
 * into the zero-instrumentation ringbuf; the same layout either way. */
struct ts_request_record {
	__u64 request_id;
	__u64 start_ns; /* CLOCK_MONOTONIC */
	__u64 latency_ns;
	__u32 tid;
	__u16 kind;  /* index into ts_region_header.kinds; 0 = unnamed */
	__u16 flags; /* TS_REC_* */
	__u64 oncpu_ns;
	__u64 runnable_ns;
	__u64 blocked_ns;
	__u64 irq_ns;
	__u64 softirq_ns;
	__u32 runnable_count;
	__u32 blocked_count;
	__u32 irq_count;
	__u32 softirq_count;
	__u32 fault_user_count;
	__u32 fault_kernel_count;
	__u32 migrations;
	__u32 vol_switches;
	__u32 invol_switches;
	__u32 cpu; /* CPU the request ended on */
};

/* ---- 3. LDB: shadow stacks, lock and request events ------------------- */

#define TS_SHADOW_DEPTH 64          /* frames stored per thread; deeper calls are counted */
#define TS_EVENT_RING_CAPACITY 1024 /* events per thread ring; power of two */
#define TS_MUTEX_THRESH_NS 1000     /* default: log a lock when wait or hold exceeds 1 us */

/* ts_region_header.features: set by the runtime */
#define TS_FEAT_FN_HOOKS 0x1  /* an instrumented function ran (-finstrument-functions) */
#define TS_FEAT_LOCK_SHIM 0x2 /* the pthread lock shim is linked in */
#define TS_FEAT_FN_CLOCK 0x4  /* frames carry entry timestamps (TAILSCOPE_FN_CLOCK=1) */
#define TS_FEAT_SNAP_GUARD                                                                         \
	0x8 /* no counters for a running thread whose switch-in BPF has not                        \
	     * seen (switch_in_ns 0): the agent may then detach the scheduler's                    \
	     * programs between burst windows, and reset the threads' state */

/* ts_region_header.ldb_flags: set by the agent while it records --functions */
#define TS_LDB_LOCKS 0x1    /* the lock shim emits MUTEX_* events */
#define TS_LDB_REQUESTS 0x2 /* tailscope_req_* emit REQ_* events */
#define TS_LDB_SLOTS                                                                               \
	0x4 /* the observer hands EXITED slots back (EXITED -> FREE) once it                       \
	     * has read their final shadow stack; until then the runtime                           \
	     * reuses only FREE slots */

/* ts_region_header.burst_gate: burst sampling windows (the agent's
 * --burst). 0: no windows, sample by the rate alone. Else
 * (window << TS_BURST_WINDOW_SHIFT) | flags: while CLOSED is set the
 * runtime starts no sampled request; DETACHED is set just before the
 * agent detaches the interrupt and fault programs (and, with
 * TS_FEAT_SNAP_GUARD, the context-switch and wake-up ones), so a sampled request
 * that began in a window and ends after its DETACHED (or in another
 * window) carries no counters. */
#define TS_AGENT_STALE_NS 3000000000ull /* see agent_heartbeat_ns */

#define TS_BURST_CLOSED 0x1
#define TS_BURST_DETACHED 0x2
#define TS_BURST_WINDOW_SHIFT 2

/* Record kinds (struct ts_event.type). FUNCTION is produced by the agent's
 * observer from shadow stacks, never written into a ring. */
#define TS_EV_FUNCTION 1
#define TS_EV_MUTEX_WAIT 2   /* object = mutex; ts = when the wait began */
#define TS_EV_MUTEX_LOCK 3   /* object = mutex; ts = when it was acquired */
#define TS_EV_MUTEX_UNLOCK 4 /* object = mutex; ts = when it was released */
#define TS_EV_REQ_START 5    /* object = request id; arg = queue (or 0) */
#define TS_EV_REQ_BLOCK 6    /* object = request id; arg = queue */
#define TS_EV_REQ_END 7      /* object = request id */
#define TS_EV_REQ_END_ALL 8  /* all requests on this thread ended */

/* One live call. `id` is the stack's gen at entry: unique per call on the
 * thread, so two calls of one function from one call site (a loop) differ. */
struct ts_frame {
	__u64 fn;       /* address of the called function */
	__u64 site;     /* return address into the caller (the call site) */
	__u64 id;       /* shadow gen at entry */
	__u64 sp;       /* stack address at entry (longjmp resync; data only) */
	__u64 entry_ns; /* CLOCK_MONOTONIC at entry with TS_FEAT_FN_CLOCK, else 0 */
};

struct ts_shadow_stack {
	__u64 gen;   /* seqlock: odd while the owner changes depth/frames */
	__u32 depth; /* logical depth; frames[0..min(depth, TS_SHADOW_DEPTH)) valid */
	__u32 _pad0;
	__u64 truncated; /* calls deeper than TS_SHADOW_DEPTH (not stored) */
	__u64 resyncs;   /* frames dropped when an exit did not match (longjmp, exceptions) */
	__u64 skipped;   /* calls not pushed: a signal handler ran while a hook was mid-update */
	__u64 _pad1[3];  /* the head fills one cache line; frames start on the next */
	struct ts_frame frames[TS_SHADOW_DEPTH];
};

struct ts_event {
	__u64 ts_ns;  /* CLOCK_MONOTONIC */
	__u64 object; /* mutex address or request id (data only, never followed) */
	__u64 arg;    /* queue address for REQ_START / REQ_BLOCK, else 0 */
	__u32 type;   /* TS_EV_* */
	__u32 tid;
};

/* slot state */
#define TS_SLOT_FREE 0
#define TS_SLOT_LIVE 1
#define TS_SLOT_EXITED 2 /* thread gone; agent drains the ring, then may reuse */

struct ts_thread_slot {
	/* written by the owning thread */
	__u32 tid;
	__u32 state;          /* TS_SLOT_* */
	__u64 gen;            /* seqlock over cur_*; odd while changing */
	__u64 cur_request_id; /* request in progress (sampled only) */
	__u64 cur_start_ns;
	__u32 cur_kind;
	__u32 cur_active;        /* 1 while a sampled request is in progress */
	__u64 ring_head;         /* records produced (monotonic); release-stored */
	__u64 dropped_ring_full; /* records lost because the ring was full */
	__u64 _pad_producer[1];
	/* written by the agent; own cache line */
	__u64 ring_tail; /* records consumed (monotonic) */
	__u64 _pad_consumer[7];
	struct ts_request_record ring[TS_RING_CAPACITY];
	/* LDB (ABI 2). The shadow stack is written by the owning thread only. */
	struct ts_shadow_stack shadow;
	__u64 ev_head;    /* events produced (monotonic); release-stored */
	__u64 ev_dropped; /* events lost because the event ring was full */
	__u64 _pad_ev_producer[6];
	__u64 ev_tail; /* events consumed; written by the agent */
	__u64 _pad_ev_consumer[7];
	struct ts_event events[TS_EVENT_RING_CAPACITY];
};

struct ts_region_header {
	__u64 magic;         /* TS_ABI_MAGIC */
	__u32 abi_version;   /* TS_ABI_VERSION */
	__u32 header_size;   /* sizeof(struct ts_region_header) */
	__u32 slot_size;     /* sizeof(struct ts_thread_slot) */
	__u32 max_slots;     /* TS_MAX_SLOTS */
	__u32 ring_capacity; /* TS_RING_CAPACITY */
	__u32 record_size;   /* sizeof(struct ts_request_record) */
	__u32 pid;
	__u32 slots_used;         /* high-water mark of claimed slots */
	__u32 sample_ppm_runtime; /* the runtime's own rate (env or default) */
	__u32 sample_ppm_agent;   /* agent override; 0 = none */
	__u32 agent_pid;          /* non-zero while an agent is attached */
	__u32 kinds_count;        /* names registered in kinds[] */
	__u64 created_ns;         /* CLOCK_MONOTONIC at creation */
	__u64 slots_exhausted;    /* threads that found no free slot */
	char kinds[TS_MAX_KINDS][TS_KIND_NAME_LEN];
	/* ABI 2 */
	__u32 shadow_depth;        /* TS_SHADOW_DEPTH */
	__u32 event_ring_capacity; /* TS_EVENT_RING_CAPACITY */
	__u32 features;            /* TS_FEAT_*, set by the runtime */
	__u32 ldb_flags;           /* TS_LDB_*, set by the agent */
	__u64 mutex_thresh_ns;     /* agent override of TS_MUTEX_THRESH_NS; 0 = default */
	__u32 burst_gate;          /* TS_BURST_*, written by the agent */
	/* While burst windows run, sample_ppm_agent is the in-window rate; this
	 * is the overall rate they add up to (tailscope_sample_ppm() returns it).
	 * 0: no bursts (agents before it leave it 0). */
	__u32 sample_ppm_effective;
	/* CLOCK_MONOTONIC of the agent's latest drain (0: not kept). A runtime
	 * whose agent's heartbeat is older than TS_AGENT_STALE_NS starts no
	 * sampled request: an agent killed with SIGKILL cannot detach, and
	 * nobody would drain what it sampled. */
	__u64 agent_heartbeat_ns;
	/* ABI 5: the agent sleeps on drain_futex (a shared futex word) with
	 * drain_waiting = 1. A thread whose request ring reaches
	 * TS_RING_WAKE_FILL records, or that exits with records in its ring,
	 * clears drain_waiting, bumps drain_futex and wakes it, so the agent
	 * need not poll at the rate a ring could fill. On their own cache line:
	 * burst_gate and the heartbeat above are read on every sampled request. */
	__u8 _pad_drain[16];
	__u32 drain_futex __attribute__((aligned(64)));
	__u32 drain_waiting;
	__u8 _reserved[376];
};

#endif /* TAILSCOPE_ABI_H */
