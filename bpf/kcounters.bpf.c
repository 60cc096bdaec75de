// SPDX-License-Identifier: Apache-2.0
/* kcounters.bpf.c — per-thread cumulative kernel-event accounting (VarMRI).
 *
 * For every thread of a target process this keeps, in its entry of the
 * mmap-able kcounters array (layout: runtime/include/tailscope/abi.h):
 *   - on-CPU time, split at each context switch;
 *   - runnable wait (preempted, or woken and not yet running) and blocked
 *     wait (switched out voluntarily until woken), with counts;
 *   - time spent in hard irqs, irq vectors (timer, IPIs, ...) and softirqs
 *     while the thread was current, net of nested interrupts;
 *   - page faults, migrations, voluntary/involuntary switches.
 * Counters only grow. Sampling happens in user space: the runtime (or
 * infer.bpf.c) snapshots an entry at request begin and end and keeps the
 * difference.
 *
 * All programs are tp_btf (raw tracepoints with typed arguments): no
 * perf-event indirection, no argument copying. Every update of an entry is
 * bracketed by the entry's seqlock.
 */
#include "vmlinux.h"
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_tracing.h>
#include <bpf/bpf_core_read.h>
#include "kc_entry.h"

char LICENSE[] SEC("license") = "GPL";

#define TASK_RUNNING 0

#define PF_EXITING 0x00000004

/* The tracked thread's entry (claimed on first sight), or NULL. An exiting
 * thread claims nothing: sched_process_exit freed its entry, and its last
 * context switch must not take a new one. */
static __always_inline struct ts_kcounters *tracked(struct task_struct *t)
{
	__u32 tgid = t->tgid;

	if (!is_target_tgid(tgid))
		return NULL;
	return kc_entry(t->pid, tgid, !(t->flags & PF_EXITING));
}

/* irq, softirq and fault events count only for threads inside a sampled
 * request (entry.sampled_refs > 0): the runtime sets it around a sampled
 * request, zero-instrumentation inference keeps a count of open sampled
 * requests. Context switches and waits are always tracked, since a snapshot
 * needs the open on-CPU interval and wait. At 1% sampling this removes the
 * clock reads from almost every interrupt a server takes. */
/* The current thread's entry if its irq/softirq/fault events count now. */
static __always_inline struct ts_kcounters *accounted_current(void)
{
	__u64 id = bpf_get_current_pid_tgid();
	struct ts_kcounters *e;

	if (!maybe_target_tgid(id >> 32))
		return NULL;
	/* Only entries of threads in a sampled request have sampled_refs set,
	 * so the entry alone decides (no set lookup, no claim). */
	e = kc_entry((__u32)id, id >> 32, false);
	if (e && *(volatile __u32 *)&e->sampled_refs)
		return e;
	return NULL;
}

/* accounted_current() for the interrupt entries, which also keep the
 * entry's index, so that the exit finds the entry with one array load
 * (no target-set lookup, no probe loop). */
static __always_inline struct ts_kcounters *accounted_current_idx(__u32 *idx_out)
{
	__u64 id = bpf_get_current_pid_tgid();
	struct ts_kcounters *e;
	__u32 idx = 0;

	if (!maybe_target_tgid(id >> 32))
		return NULL;
	e = kc_find((__u32)id, &idx);
	if (!e || !*(volatile __u32 *)&e->sampled_refs)
		return NULL;
	*idx_out = idx;
	return e;
}

/* ---- scheduler ---------------------------------------------------------- */

/* Since 5.18 the raw tracepoint carries the real prev_state (TASK_RUNNING
 * when a would-be sleeper had a signal pending) and a preempt flag. The
 * tracefs view encodes preemption as prev_state = TASK_REPORT_MAX instead,
 * so do not port this test to a classic tracepoint unchanged. */
SEC("tp_btf/sched_switch")
int BPF_PROG(sched_switch, bool preempt, struct task_struct *prev, struct task_struct *next,
             unsigned int prev_state)
{
	struct ts_kcounters *p = tracked(prev), *n = tracked(next);
	__u64 now = 0; /* read only if a target switches (not the common case) */

	if (p) {
		now = bpf_ktime_get_ns();
		kc_write_begin(p);
		if (p->switch_in_ns && now > p->switch_in_ns)
			p->oncpu_ns += now - p->switch_in_ns;
		p->switch_in_ns = 0;
		if (preempt || prev_state == TASK_RUNNING) {
			p->invol_switches++;
			p->wait_state = TS_WAIT_RUNNABLE;
		} else {
			p->vol_switches++;
			p->wait_state = TS_WAIT_BLOCKED;
		}
		p->wait_since_ns = now;
		p->last_blocked_ns = 0;
		kc_write_end(p);
	}
	if (n) {
		if (!now)
			now = bpf_ktime_get_ns();
		kc_write_begin(n);
		if (n->wait_state != TS_WAIT_NONE && now > n->wait_since_ns) {
			__u64 waited = now - n->wait_since_ns;

			if (n->wait_state == TS_WAIT_RUNNABLE) {
				n->runnable_ns += waited;
				n->runnable_count++;
			} else { /* BLOCKED: the wakeup was missed */
				n->blocked_ns += waited;
				n->blocked_count++;
			}
		}
		n->wait_state = TS_WAIT_NONE;
		n->switch_in_ns = now;
		kc_write_end(n);
	}
	return 0;
}

static __always_inline void on_wakeup(struct task_struct *p, bool is_new)
{
	struct ts_kcounters *e = tracked(p);
	__u64 now;

	if (!e)
		return;
	now = bpf_ktime_get_ns();
	if (e->wait_state == TS_WAIT_BLOCKED) {
		__u64 blocked = now > e->wait_since_ns ? now - e->wait_since_ns : 0;

		kc_write_begin(e);
		e->blocked_ns += blocked;
		e->blocked_count++;
		e->last_blocked_ns = blocked > 0xffffffffULL ? 0xffffffffU : (__u32)blocked;
		e->wait_state = TS_WAIT_RUNNABLE;
		e->wait_since_ns = now;
		kc_write_end(e);
	} else if (is_new && e->wait_state == TS_WAIT_NONE && !e->switch_in_ns) {
		/* a new thread waits for its first CPU */
		kc_write_begin(e);
		e->wait_state = TS_WAIT_RUNNABLE;
		e->wait_since_ns = now;
		kc_write_end(e);
	}
}

SEC("tp_btf/sched_wakeup")
int BPF_PROG(sched_wakeup, struct task_struct *p)
{
	on_wakeup(p, false);
	return 0;
}

SEC("tp_btf/sched_wakeup_new")
int BPF_PROG(sched_wakeup_new, struct task_struct *p)
{
	on_wakeup(p, true);
	return 0;
}

SEC("tp_btf/sched_migrate_task")
int BPF_PROG(sched_migrate_task, struct task_struct *p, int dest_cpu)
{
	struct ts_kcounters *e = tracked(p);

	if (e) {
		kc_write_begin(e);
		e->migrations++;
		kc_write_end(e);
	}
	return 0;
}

/* Follow `sh -c` wrappers and forking servers: a child process of a
 * target is a target. (New threads share the tgid and need nothing.) */
SEC("tp_btf/sched_process_fork")
int BPF_PROG(sched_process_fork, struct task_struct *parent, struct task_struct *child)
{
	__u32 ptgid = parent->tgid, ctgid = child->tgid;
	__u8 one = 1;

	if (ptgid != ctgid && is_target_tgid(ptgid)) {
		mark_target_bucket(ctgid);
		bpf_map_update_elem(&targets, &ctgid, &one, BPF_ANY);
	}
	return 0;
}

/* A thread that exits frees its entry; the last thread of a target process
 * removes the process from the target set (pids get reused). */
SEC("tp_btf/sched_process_exit")
int BPF_PROG(sched_process_exit, struct task_struct *p)
{
	__u32 tgid = p->tgid, tid = p->pid;
	struct ts_kcounters *e;

	if (!is_target_tgid(tgid))
		return 0;
	e = kc_entry(tid, tgid, false);
	if (e) {
		kc_write_begin(e);
		e->switch_in_ns = 0;
		e->wait_state = TS_WAIT_NONE;
		e->tgid = 0;
		kc_write_end(e);
		__sync_val_compare_and_swap(&e->tid, tid, 0);
	}
	/* signal->live is decremented before the tracepoint fires (any kernel
	 * version, unlike the group_dead argument added in 6.16) */
	if (p->signal && p->signal->live.counter == 0)
		bpf_map_delete_elem(&targets, &tgid);
	return 0;
}

/* ---- faults ------------------------------------------------------------- */

SEC("tp_btf/page_fault_user")
int BPF_PROG(page_fault_user)
{
	struct ts_kcounters *e = accounted_current();

	if (e) {
		kc_write_begin(e);
		e->fault_user_count++;
		kc_write_end(e);
	}
	return 0;
}

SEC("tp_btf/page_fault_kernel")
int BPF_PROG(page_fault_kernel)
{
	struct ts_kcounters *e = accounted_current();

	if (e) {
		kc_write_begin(e);
		e->fault_kernel_count++;
		kc_write_end(e);
	}
	return 0;
}

/* ---- interrupts ----------------------------------------------------------
 *
 * Interrupts nest (a hard irq inside a softirq, an IPI inside an irq), so
 * each CPU keeps a shadow stack of open interrupt frames. On exit:
 *     total  = now - frame.start
 *     actual = total - frame.nested_ns     (time of nested interrupts)
 *     parent.nested_ns += total
 * and `actual` goes to the thread that is current on this CPU, if tracked.
 * Unbalanced events are tolerated: an exit with an empty stack (we attached
 * mid-interrupt) or of the wrong kind is ignored; frames deeper than
 * IRQ_STACK_DEPTH are counted but not timed.
 */
#define IRQ_STACK_DEPTH 8
#define KIND_IRQ 1
#define KIND_SOFTIRQ 2
#define MAX_IRQ_NS (1000ULL * 1000 * 1000) /* longer means a lost exit */

struct ts_irq_frame {
	__u64 start;
	__u64 nested_ns;
	__u32 kind;
	__u32 kc_idx; /* the interrupted thread's kcounters entry (timed frames) */
};

struct ts_irq_stack {
	__u32 depth; /* may exceed IRQ_STACK_DEPTH; frames above are untimed */
	__u32 _pad;
	struct ts_irq_frame f[IRQ_STACK_DEPTH];
};

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct ts_irq_stack);
} irq_stacks SEC(".maps");

static __always_inline void irq_enter(__u32 kind)
{
	__u32 zero = 0;
	struct ts_irq_stack *s = bpf_map_lookup_elem(&irq_stacks, &zero);
	__u32 d;

	if (!s)
		return;
	d = s->depth;
	if (d < IRQ_STACK_DEPTH) {
		d &= IRQ_STACK_DEPTH - 1;
		/* An interrupt runs on the interrupted task's behalf; if that
		 * task's events do not count now (no target, or not
		 * in a sampled request), the frame stays untimed: start 0, no
		 * clock read, and its exit returns at once. */
		__u32 idx = 0;

		s->f[d].start = accounted_current_idx(&idx) ? bpf_ktime_get_ns() : 0;
		s->f[d].nested_ns = 0;
		s->f[d].kind = kind;
		s->f[d].kc_idx = idx;
	}
	if (s->depth < 64)
		s->depth++;
}

static __always_inline void irq_exit(__u32 kind)
{
	__u32 zero = 0;
	struct ts_irq_stack *s = bpf_map_lookup_elem(&irq_stacks, &zero);
	struct ts_kcounters *e;
	__u64 now, total, actual;
	__u32 d, idx;

	if (!s || !s->depth)
		return;
	d = s->depth - 1;
	if (d >= IRQ_STACK_DEPTH) {
		s->depth = d;
		return;
	}
	d &= IRQ_STACK_DEPTH - 1; /* no-op; for the verifier */
	if (s->f[d].kind != kind)
		return;
	s->depth = d;
	if (!s->f[d].start)
		return; /* untimed: the interrupted task is no target */
	now = bpf_ktime_get_ns();
	if (now <= s->f[d].start)
		return;
	total = now - s->f[d].start;
	if (total > MAX_IRQ_NS)
		return;
	actual = total > s->f[d].nested_ns ? total - s->f[d].nested_ns : 0;
	if (d > 0) /* the mask only convinces the verifier; d < IRQ_STACK_DEPTH */
		s->f[(d - 1) & (IRQ_STACK_DEPTH - 1)].nested_ns += total;

	/* The entry the frame's start found: an interrupt runs on the
	 * interrupted thread's behalf and cannot switch it out, so the entry
	 * is still that thread's (the tid check guards against a reuse). */
	idx = s->f[d].kc_idx;
	e = bpf_map_lookup_elem(&kcounters, &idx);
	if (!e || e->tid != (__u32)bpf_get_current_pid_tgid())
		return;
	kc_write_begin(e);
	if (kind == KIND_IRQ) {
		e->irq_ns += actual;
		e->irq_count++;
	} else {
		e->softirq_ns += actual;
		e->softirq_count++;
	}
	kc_write_end(e);
}

#define IRQ_PAIR(entry_tp, exit_tp, kind)                                                          \
	SEC("tp_btf/" #entry_tp)                                                                   \
	int BPF_PROG(entry_tp)                                                                     \
	{                                                                                          \
		irq_enter(kind);                                                                   \
		return 0;                                                                          \
	}                                                                                          \
	SEC("tp_btf/" #exit_tp)                                                                    \
	int BPF_PROG(exit_tp)                                                                      \
	{                                                                                          \
		irq_exit(kind);                                                                    \
		return 0;                                                                          \
	}

IRQ_PAIR(irq_handler_entry, irq_handler_exit, KIND_IRQ)
IRQ_PAIR(softirq_entry, softirq_exit, KIND_SOFTIRQ)
IRQ_PAIR(local_timer_entry, local_timer_exit, KIND_IRQ)
IRQ_PAIR(call_function_entry, call_function_exit, KIND_IRQ)
IRQ_PAIR(call_function_single_entry, call_function_single_exit, KIND_IRQ)
IRQ_PAIR(reschedule_entry, reschedule_exit, KIND_IRQ)
IRQ_PAIR(irq_work_entry, irq_work_exit, KIND_IRQ)
IRQ_PAIR(x86_platform_ipi_entry, x86_platform_ipi_exit, KIND_IRQ)
IRQ_PAIR(error_apic_entry, error_apic_exit, KIND_IRQ)
IRQ_PAIR(spurious_apic_entry, spurious_apic_exit, KIND_IRQ)
IRQ_PAIR(thermal_apic_entry, thermal_apic_exit, KIND_IRQ)
