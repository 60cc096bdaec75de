// SPDX-License-Identifier: Apache-2.0
/* infer.bpf.c — zero-instrumentation request inference from socket syscalls.
 *
 * For a binary without libtailscope (stock redis, memcached, nginx), a
 * request on a target thread is the span
 *     from  sys_enter of the first read-family call (read, recvfrom,
 *           recvmsg, readv) on a socket fd that returns > 0,
 *     to    sys_exit of the next write-family call (write, sendto, sendmsg,
 *           writev) on a socket fd that returns > 0,
 * by the same thread. Reads while a request is open do not start another
 * one (pipelined requests merge; see bpf/README.md for the failure modes).
 *
 * The sampling decision is drawn at the read's sys_enter, and a sampled
 * request snapshots the thread's kcounters entry there (the in-progress
 * on-CPU interval included, as the runtime does) and again at the write's
 * sys_exit; the difference goes out as a struct ts_request_record on a
 * ringbuf. A full ringbuf is counted, never waited on.
 *
 * Raw syscall tracepoints (tp_btf/sys_enter, sys_exit) with a switch on
 * the x86-64 syscall number: they run on every syscall of every process,
 * but measured ~10x cheaper per syscall here (~90 ns vs ~1 us) than the classic
 * tracepoints (syscalls:sys_enter_read, ...), which go through the perf
 * buffer. The loader attaches them only when inference is enabled.
 */
#include "vmlinux.h"
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_tracing.h>
#include <bpf/bpf_core_read.h>
#include "kc_entry.h"

char LICENSE[] SEC("license") = "GPL";

/* Set by the loader before load; the only .rodata variable (the loader
 * writes it at offset 0). */
const volatile struct {
	__u32 sample_ppm;
	__u32 _pad;
} infer_cfg = { .sample_ppm = TS_PPM };

#define barrier() asm volatile("" ::: "memory")
#define S_IFMT 00170000
#define S_IFSOCK 0140000

/* stats[] indexes (per-CPU; the loader sums) */
#define STAT_SEEN 0
#define STAT_SAMPLED 1
#define STAT_DROPS 2
#define STAT_TORN 3
#define STAT_MAX 4

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, STAT_MAX);
	__type(key, __u32);
	__type(value, __u64);
} infer_stats SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_RINGBUF);
	__uint(max_entries, 4 << 20); /* resized by the loader */
} records SEC(".maps");

/* A counter snapshot: the cumulative fields of ts_kcounters. */
struct kc_snap {
	__u64 oncpu_ns, runnable_ns, blocked_ns, irq_ns, softirq_ns;
	__u32 runnable_count, blocked_count, irq_count, softirq_count;
	__u32 fault_user_count, fault_kernel_count, migrations;
	__u32 vol_switches, invol_switches;
	__u32 valid; /* 0: no entry; 1: consistent; 2: torn */
};

struct req_state {
	__u64 seq;          /* requests begun by this thread */
	__u64 enter_ns;     /* sys_enter of the pending read */
	__u64 start_ns;     /* start of the open request */
	__u8 pending;       /* 1: read in flight, 2: write in flight, 3: read inside a request */
	__u8 pending_sock;  /* the in-flight call is on a socket */
	__u8 active;        /* a request is open */
	__u8 sampled;       /* the pending read / open request is sampled */
	__u32 enter_vol;    /* vol_switches at the read's sys_enter */
	__u64 pending_sk;   /* struct sock * of the in-flight call */
	__u8 from_arrival;  /* start/begin come from the socket's arrival */
	__u8 _pad2[7];
	__u64 last_end_ns;  /* end of the thread's previous request */
	__u32 end_blocked;  /* blocked_count at that end */
	__u32 _pad;
	struct kc_snap begin;
};

struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 65536);
	__type(key, __u32);
	__type(value, struct req_state);
} req_states SEC(".maps");

/* The per-thread state is too big for the stack; build new ones here. */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct req_state);
} zero_state SEC(".maps");

/* Data arrival on a watched TCP socket (tcp:tcp_probe, softirq context):
 * when the first unread bytes landed, whether that request is sampled, and
 * the reading thread's counters at that moment. A request then runs from
 * the arrival of its bytes to the write that answers it, so time spent
 * queued in the socket while the server was preempted or busy is part of
 * it, as the client sees it. Sockets are watched once a target thread
 * reads from them. */
struct sock_state {
	__u32 tid;          /* thread that last read this socket */
	__u32 tgid;
	__u64 arrival_ns;   /* first unread data arrived; 0: none pending */
	__u8 sampled;
	__u8 _pad[7];
	struct kc_snap snap;
};

struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 65536);
	__type(key, __u64); /* struct sock * */
	__type(value, struct sock_state);
} socks SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct sock_state);
} zero_sock SEC(".maps");

static __always_inline void stat_inc(__u32 i)
{
	__u64 *v = bpf_map_lookup_elem(&infer_stats, &i);

	if (v)
		*v += 1;
}

static __always_inline bool fd_is_socket(struct task_struct *task, long fd, __u64 *skp)
{
	struct files_struct *files;
	struct fdtable *fdt;
	struct file **fda, *file = NULL;
	unsigned int max_fds;
	umode_t mode;

	if (fd < 0)
		return false;
	files = BPF_CORE_READ(task, files);
	if (!files)
		return false;
	fdt = BPF_CORE_READ(files, fdt);
	if (!fdt)
		return false;
	max_fds = BPF_CORE_READ(fdt, max_fds);
	if ((unsigned long)fd >= max_fds)
		return false;
	fda = BPF_CORE_READ(fdt, fd);
	if (bpf_probe_read_kernel(&file, sizeof(file), &fda[fd]) || !file)
		return false;
	mode = BPF_CORE_READ(file, f_inode, i_mode);
	if ((mode & S_IFMT) != S_IFSOCK)
		return false;
	{
		struct socket *sock = BPF_CORE_READ(file, private_data);

		*skp = sock ? (__u64)BPF_CORE_READ(sock, sk) : 0;
	}
	return true;
}

/* Seqlock-consistent copy of the thread's counters, with the open on-CPU
 * interval closed at `now`. Two tries, then it is marked torn. */
static __always_inline void snapshot(__u32 tid, __u32 tgid, __u64 now, struct kc_snap *s)
{
	struct ts_kcounters *e = kc_entry(tid, tgid, true);

	s->valid = 0;
	if (!e)
		return;
	for (int try = 0; try < 2; try++) {
		__u32 seq0 = *(volatile __u32 *)&e->seq;
		barrier();
		__u64 in = e->switch_in_ns;

		s->oncpu_ns = e->oncpu_ns + (in && now > in ? now - in : 0);
		s->runnable_ns = e->runnable_ns;
		s->blocked_ns = e->blocked_ns;
		s->irq_ns = e->irq_ns;
		s->softirq_ns = e->softirq_ns;
		s->runnable_count = e->runnable_count;
		s->blocked_count = e->blocked_count;
		s->irq_count = e->irq_count;
		s->softirq_count = e->softirq_count;
		s->fault_user_count = e->fault_user_count;
		s->fault_kernel_count = e->fault_kernel_count;
		s->migrations = e->migrations;
		s->vol_switches = e->vol_switches;
		s->invol_switches = e->invol_switches;
		/* Close an open wait at `now` too (a snapshot taken from softirq
		 * while the reader sleeps or waits for a CPU), so the difference
		 * of two snapshots counts only the wait after the first. */
		{
			__u32 state = e->wait_state;
			__u64 since = e->wait_since_ns;

			if (!in && since && now > since) {
				if (state == TS_WAIT_BLOCKED)
					s->blocked_ns += now - since;
				else if (state == TS_WAIT_RUNNABLE)
					s->runnable_ns += now - since;
			}
		}
		barrier(); /* x86 is TSO: a compiler barrier orders the loads */
		if (!(seq0 & 1) && *(volatile __u32 *)&e->seq == seq0) {
			s->valid = 1;
			return;
		}
	}
	s->valid = 2;
}

static __always_inline void on_enter(long fd, bool is_read)
{
	struct task_struct *task = bpf_get_current_task_btf();
	__u64 id = bpf_get_current_pid_tgid();
	__u32 tid = (__u32)id, tgid = id >> 32, zero = 0;
	struct req_state *st;
	__u64 sk = 0;

	if (!is_target_tgid(tgid))
		return;
	st = bpf_map_lookup_elem(&req_states, &tid);
	if (!st) {
		if (!is_read)
			return; /* a write outside a request: nothing to end */
		st = bpf_map_lookup_elem(&zero_state, &zero);
		if (!st)
			return;
		bpf_map_update_elem(&req_states, &tid, st, BPF_NOEXIST);
		st = bpf_map_lookup_elem(&req_states, &tid);
		if (!st)
			return;
	}
	st->pending = 0;
	if (is_read && st->active) {
		/* A read inside a request (an event loop reading another
		 * connection): it joins this request, but its socket's arrival
		 * must be consumed, or a later request on it would start at
		 * this stale arrival. */
		if (fd_is_socket(task, fd, &sk)) {
			st->pending = 3;
			st->pending_sk = sk;
		}
		return;
	}
	if (is_read == (bool)st->active)
		return; /* write outside a request */
	if (!fd_is_socket(task, fd, &sk))
		return;
	st->pending = is_read ? 1 : 2;
	st->pending_sk = sk;
	if (is_read) {
		__u64 now = bpf_ktime_get_ns();

		struct ts_kcounters *e = kc_entry(tid, tgid, true);

		st->enter_ns = now;
		st->enter_vol = e ? e->vol_switches : 0;
		st->sampled = bpf_get_prandom_u32() % TS_PPM < infer_cfg.sample_ppm;
		if (st->sampled)
			snapshot(tid, tgid, now, &st->begin);
		/* An event loop sleeps (epoll_wait, poll) until a request arrives,
		 * then reads it. If the thread slept since its previous request
		 * ended, this request has been waiting since that wakeup: start
		 * it there, so the runnable wait between wakeup and CPU (what a
		 * CPU hog inflates) is the request's, as the client sees it. */
		if (e && e->blocked_count != st->end_blocked) {
			__u64 woke = e->wait_since_ns, in = e->switch_in_ns;

			if (woke > st->last_end_ns && in >= woke && woke <= now) {
				st->enter_ns = woke;
				if (st->sampled) {
					snapshot(tid, tgid, in, &st->begin);
					if (st->begin.runnable_ns >= in - woke)
						st->begin.runnable_ns -= in - woke;
					if (in > woke && st->begin.runnable_count)
						st->begin.runnable_count--;
				}
			}
		}
		st->from_arrival = 0;
		if (sk) {
			struct sock_state *ss = bpf_map_lookup_elem(&socks, &sk);

			if (!ss) {
				struct sock_state *z = bpf_map_lookup_elem(&zero_sock, &zero);

				if (z) {
					z->tid = tid;
					z->tgid = tgid;
					z->arrival_ns = 0;
					bpf_map_update_elem(&socks, &sk, z, BPF_NOEXIST);
				}
			} else {
				ss->tid = tid;
				ss->tgid = tgid;
				if (ss->arrival_ns && ss->arrival_ns <= now) {
					st->enter_ns = ss->arrival_ns;
					st->sampled = ss->sampled;
					if (ss->sampled)
						__builtin_memcpy(&st->begin, &ss->snap,
								 sizeof(st->begin));
					st->from_arrival = 1;
				}
			}
		}
	}
}

#define D(f) rec->f = end.f - st->begin.f

static __always_inline void on_exit(long ret, bool is_read)
{
	__u64 id = bpf_get_current_pid_tgid();
	__u32 tid = (__u32)id, tgid = id >> 32;
	struct ts_request_record *rec;
	struct req_state *st;
	struct kc_snap end;
	__u64 now;

	if (!is_target_tgid(tgid))
		return;
	st = bpf_map_lookup_elem(&req_states, &tid);
	if (st && st->pending == 3 && is_read) {
		__u64 sk = st->pending_sk;
		struct sock_state *ss = ret > 0 && sk ? bpf_map_lookup_elem(&socks, &sk) : NULL;

		st->pending = 0;
		if (ss)
			ss->arrival_ns = 0;
		return;
	}
	if (!st || st->pending != (is_read ? 1 : 2))
		return;
	st->pending = 0;
	if (ret <= 0)
		return;

	if (is_read) { /* data arrived on a socket: a request begins */
		struct ts_kcounters *e = kc_entry(tid, tgid, false);
		__u64 sk = st->pending_sk;
		struct sock_state *ss = sk ? bpf_map_lookup_elem(&socks, &sk) : NULL;

		if (ss)
			ss->arrival_ns = 0; /* consumed; the next bytes start the next one */
		st->active = 1;
		st->start_ns = st->enter_ns;
		if (st->from_arrival)
			goto begun;
		/* A blocking read slept until the data came: the request starts
		 * at that wakeup (wait_since_ns keeps it after the switch-in),
		 * not at the sys_enter; the runnable wait after it is the
		 * request's, the blocked wait before it is not. */
		if (e && e->vol_switches != st->enter_vol) {
			__u64 woke = e->wait_since_ns, in = e->switch_in_ns;

			if (woke >= st->enter_ns && in >= woke) {
				st->start_ns = woke;
				if (st->sampled) {
					snapshot(tid, tgid, in, &st->begin);
					st->begin.runnable_ns -= in - woke;
					if (st->begin.runnable_count)
						st->begin.runnable_count--;
				}
			}
		}
begun:
		st->seq++;
		stat_inc(STAT_SEEN);
		if (st->sampled)
			stat_inc(STAT_SAMPLED);
		return;
	}

	/* data went out on a socket: the request ends */
	st->active = 0;
	now = bpf_ktime_get_ns();
	st->last_end_ns = now;
	{
		struct ts_kcounters *e = kc_entry(tid, tgid, false);

		st->end_blocked = e ? e->blocked_count : 0;
	}
	if (!st->sampled)
		return;
	rec = bpf_ringbuf_reserve(&records, sizeof(*rec), 0);
	if (!rec) {
		stat_inc(STAT_DROPS);
		return;
	}
	__builtin_memset(rec, 0, sizeof(*rec));
	rec->request_id = ((__u64)tid << 32) | (__u32)st->seq;
	rec->start_ns = st->start_ns;
	rec->latency_ns = now - st->start_ns;
	rec->tid = tid;
	rec->kind = 0;
	rec->flags = TS_REC_SAMPLED | TS_REC_INFERRED;
	rec->cpu = bpf_get_smp_processor_id();
	snapshot(tid, tgid, now, &end);
	if (end.valid && st->begin.valid) {
		rec->flags |= TS_REC_COUNTERS;
		if (end.valid == 2 || st->begin.valid == 2) {
			rec->flags |= TS_REC_TORN;
			stat_inc(STAT_TORN);
		}
		D(oncpu_ns); D(runnable_ns); D(blocked_ns); D(irq_ns); D(softirq_ns);
		D(runnable_count); D(blocked_count); D(irq_count); D(softirq_count);
		D(fault_user_count); D(fault_kernel_count); D(migrations);
		D(vol_switches); D(invol_switches);
	}
	bpf_ringbuf_submit(rec, 0);
}

/* x86-64 syscall numbers of the read and write families. */
#define NR_read 0
#define NR_write 1
#define NR_readv 19
#define NR_writev 20
#define NR_sendto 44
#define NR_recvfrom 45
#define NR_sendmsg 46
#define NR_recvmsg 47

/* 1: read family, 2: write family, 0: not ours */
static __always_inline int family(long id)
{
	switch (id) {
	case NR_read: case NR_readv: case NR_recvfrom: case NR_recvmsg:
		return 1;
	case NR_write: case NR_writev: case NR_sendto: case NR_sendmsg:
		return 2;
	}
	return 0;
}

SEC("tp_btf/sys_enter")
int BPF_PROG(sys_enter, struct pt_regs *regs, long id)
{
	int f = family(id);

	if (f)
		on_enter((long)regs->di, f == 1);
	return 0;
}

SEC("tp_btf/sys_exit")
int BPF_PROG(sys_exit, struct pt_regs *regs, long ret)
{
	int f = family(regs->orig_ax);

	if (f)
		on_exit(ret, f == 1);
	return 0;
}

/* Bytes arrived on a TCP socket (softirq, any CPU). For a watched socket
 * with nothing pending, remember when, decide sampling, and snapshot the
 * reading thread's counters. Pure ACKs carry no data and are ignored. */
SEC("tp_btf/tcp_probe")
int BPF_PROG(tcp_probe, struct sock *sk, struct sk_buff *skb)
{
	__u64 key = (__u64)sk;
	struct sock_state *ss = bpf_map_lookup_elem(&socks, &key);
	unsigned char *data;
	struct tcphdr th;
	__u32 len;

	if (!ss || ss->arrival_ns)
		return 0;
	len = BPF_CORE_READ(skb, len);
	data = BPF_CORE_READ(skb, data);
	if (bpf_probe_read_kernel(&th, sizeof(th), data))
		return 0;
	if (len <= (__u32)th.doff * 4)
		return 0;
	__u64 now = bpf_ktime_get_ns();

	ss->sampled = bpf_get_prandom_u32() % TS_PPM < infer_cfg.sample_ppm;
	if (ss->sampled)
		snapshot(ss->tid, ss->tgid, now, &ss->snap);
	ss->arrival_ns = now;
	return 0;
}
