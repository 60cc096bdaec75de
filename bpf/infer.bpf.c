// SPDX-License-Identifier: Apache-2.0
/* infer.bpf.c — zero-instrumentation request inference from socket I/O.
 *
 * For a binary without libtailscope (stock redis, memcached, nginx), a
 * request is tracked per connection (per struct sock):
 *     it is opened by the first receive that consumes data on that socket
 *     (TCP: tcp:tcp_rcv_space_adjust, which tcp_recvmsg runs per consumed
 *     skb; Unix: sock:sock_recv_length, ret > 0), starts when its bytes
 *     landed in the socket (TCP: the socket's tcp_clock_cache, which the
 *     kernel stamps for every segment it processes, read before the receive
 *     refreshes it), and
 *     ends at the next data-bearing send on the same socket
 *     (sock:sock_send_length, ret > 0).
 * Keeping the state per socket, not per thread, keeps an event loop's batch
 * apart: redis reads A, reads B, then writes A and B; A and B are two
 * requests, each from its own arrival to its own reply.
 *
 * Two programs do work per request, both in the server's own syscalls;
 * nothing runs per packet. (An earlier version marked arrivals from
 * tcp:tcp_probe, which fires for every segment of every TCP socket on the
 * machine, both directions.) The sock tracepoints fire inside
 * sock_recvmsg/sock_sendmsg, so only socket I/O pays; other syscalls cost
 * nothing, and a process that is no target is turned away by one array load.
 * Per-socket state lives in socket local storage (freed with the socket),
 * per-thread state in task local storage.
 *
 * Which sockets carry requests: a TCP socket whose local port is a
 * listening port (the server side of a connection), tracked in
 * `server_ports` (set from /proc by the loader at attach and by
 * sock:inet_sock_set_state for listeners created later); any Unix socket.
 * Other sockets (the target's own client connections to a database or an
 * upstream, UDP) are ignored.
 *
 * The sampling decision is drawn when the request opens. A sampled request
 * snapshots the reading thread's kcounters entry there and rewinds it to the
 * request's start (the arrival): on-CPU time since then, and the part of the
 * thread's last wait after it, are moved into the request, using the
 * entry's switch_in_ns, wait_since_ns and last_blocked_ns (see rewind()).
 * At the end it snapshots again; the difference goes out as a struct
 * ts_request_record on a ringbuf. A full ringbuf is counted, never waited on.
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
	__u32 salt; /* random per load: TCP sampling draws differ between recordings */
} infer_cfg = {.sample_ppm = TS_PPM};

#define barrier() asm volatile("" ::: "memory")
#define AF_UNIX 1
#define AF_INET 2
#define AF_INET6 10
#define IPPROTO_TCP 6
#define MSG_PEEK 2
#define TCP_FIN_WAIT1 4
#define TCP_CLOSE 7
#define TCP_LAST_ACK 9
#define TCP_LISTEN 10

/* stats[] indexes (per-CPU; the loader sums) */
#define STAT_SEEN 0
#define STAT_SAMPLED 1
#define STAT_DROPS 2
#define STAT_TORN 3
#define STAT_ABANDONED 4 /* sampled requests whose connection closed before a reply */
#define STAT_MAX 5

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

/* Local TCP ports something listens on (1: yes). Filled by the loader from
 * /proc/<pid>/net/tcp{,6} and by inet_sock_set_state(* -> LISTEN). */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 65536);
	__type(key, __u32);
	__type(value, __u8);
} server_ports SEC(".maps");

/* Burst sampling (the agent's --burst). burst_gate[0] = window << 1 |
 * closed. Outside a sampling window bit 0 is set and no request is
 * sampled. A window ends in this order (agent): close the gate; wait until
 * the window's sampled requests have ended (open_sampled, below); detach
 * the per-request and per-interrupt programs; bump the window number (gate
 * still closed) and clear the new window's open_sampled slot. The next
 * window re-attaches, then opens the gate. A sampled request still open
 * at the detach (its end went unseen) belongs to an older window: the next
 * program that meets it drops it. Zero (the initial value) means open,
 * window 0, which is all a recording without bursts ever sees. */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, __u32);
} burst_gate SEC(".maps");

static __always_inline __u32 gate_value(void)
{
	__u32 zero = 0;
	__u32 *v = bpf_map_lookup_elem(&burst_gate, &zero);

	return v ? *(volatile __u32 *)v : 1;
}

static __always_inline bool gate_open(void)
{
	return !(gate_value() & 1);
}

static __always_inline __u32 cur_window(void)
{
	return gate_value() >> 1;
}

/* Sampled requests open right now (all targets), per window parity: the
 * agent waits for the closing window's slot to reach zero. While both are
 * zero, which at low sampling rates is most of the time, a TCP send needs
 * no socket lookup at all. A slot is cleared by the agent when its parity
 * is reused two windows later, so only requests of the current and the
 * previous window may decrement theirs. */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 2);
	__type(key, __u32);
	__type(value, __s64);
} open_sampled SEC(".maps");

static __always_inline void open_sampled_add(__u32 window, __s64 d)
{
	__u32 cur = cur_window(), k = window & 1;
	__s64 *v;

	if (d < 0 && window != cur && window + 1 != cur)
		return; /* its slot was cleared since */
	v = bpf_map_lookup_elem(&open_sampled, &k);
	if (v)
		__sync_fetch_and_add(v, d);
}

static __always_inline bool any_open_sampled(void)
{
	__u32 k0 = 0, k1 = 1;
	__s64 *a = bpf_map_lookup_elem(&open_sampled, &k0);
	__s64 *b = bpf_map_lookup_elem(&open_sampled, &k1);

	return (a && *(volatile __s64 *)a > 0) || (b && *(volatile __s64 *)b > 0);
}

/* A counter snapshot: the cumulative fields of ts_kcounters, and where the
 * thread's last on-CPU interval and wait began (for rewind()). */
struct kc_snap {
	__u64 oncpu_ns, runnable_ns, blocked_ns, irq_ns, softirq_ns;
	__u64 in_ns, wait_since_ns;
	__u32 runnable_count, blocked_count, irq_count, softirq_count;
	__u32 fault_user_count, fault_kernel_count, migrations;
	__u32 vol_switches, invol_switches;
	__u32 last_blocked_ns;
	__u32 valid; /* 0: no entry; 1: consistent; 2: torn */
};

/* Per connection. */
struct sk_req {
	__u32 tid; /* thread that last received on it (0: none yet) */
	__u32 tgid;
	__u64 start_ns;   /* start of the open request, if it is sampled */
	__u64 request_id; /* of the open request, if it is sampled */
	__u8 ignore;      /* not the server side of a connection */
	__u8 active;      /* a request is open */
	__u8 sampled;     /* the open request is sampled (holds a ref on ref_tid) */
	__u8 no_stamp;    /* a Unix socket: no arrival stamps; starts use wakeups */
	__u32 ref_tid;    /* whose sampled_refs the open sampled request holds */
	__u32 open_wseq;  /* TCP: the socket's write_seq when the open request opened */
	__u32 window;     /* burst window the open request opened in */
	struct kc_snap begin;
};

struct {
	__uint(type, BPF_MAP_TYPE_SK_STORAGE);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__type(key, int);
	__type(value, struct sk_req);
} sk_reqs SEC(".maps");

/* Per thread. */
struct thr_state {
	__u64 seq;         /* requests opened by this thread */
	__u64 last_end_ns; /* end of its previous request */
	__u32 end_blocked; /* its blocked_count then */
	__u32 window;      /* burst window of that end */
};

struct {
	__uint(type, BPF_MAP_TYPE_TASK_STORAGE);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__type(key, int);
	__type(value, struct thr_state);
} thr_states SEC(".maps");

static __always_inline void stat_inc(__u32 i)
{
	__u64 *v = bpf_map_lookup_elem(&infer_stats, &i);

	if (v)
		*v += 1;
}

static __always_inline bool sampled_draw(void)
{
	return gate_open() && bpf_get_prandom_u32() % TS_PPM < infer_cfg.sample_ppm;
}

/* splitmix64's finaliser. */
static __always_inline __u64 mix64(__u64 x)
{
	x ^= x >> 30;
	x *= 0xbf58476d1ce4e5b9ULL;
	x ^= x >> 27;
	x *= 0x94d049bb133111ebULL;
	x ^= x >> 31;
	return x;
}

/* The sampling decision for the TCP request whose bytes are being read,
 * drawn without any per-socket state: a hash of the connection and of its
 * write_seq (bytes the server has queued to send so far). Every receive of
 * one request sees the same write_seq, since nothing was sent in between,
 * so they all draw alike; the reply moves it, so the next request draws
 * anew. An unsampled request thus costs no socket-storage lookup, here or
 * at its send. */
static __always_inline bool tcp_request_sampled(struct sock *sk, __u32 wseq)
{
	__u64 conn = sk->__sk_common.skc_addrpair ^ ((__u64)sk->__sk_common.skc_portpair << 17);
	__u64 h = mix64(conn ^ ((__u64)wseq << 32) ^ infer_cfg.salt);

	return h % TS_PPM < infer_cfg.sample_ppm && gate_open();
}

/* Seqlock-consistent copy of the thread's counters, with the open on-CPU
 * interval and any open wait closed at `now`. Two tries, then torn. */
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
		s->in_ns = in;
		s->wait_since_ns = e->wait_since_ns;
		s->last_blocked_ns = e->last_blocked_ns;
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

static __always_inline void sub64(__u64 *v, __u64 d)
{
	*v = *v > d ? *v - d : 0;
}

static __always_inline void dec32(__u32 *v)
{
	if (*v)
		(*v)--;
}

/* Turns `b`, a snapshot of the current thread taken at `now`, into the
 * counters as they stood at `a` <= now, so that the request that started at
 * `a` owns what the thread did since. The entry remembers the open on-CPU
 * interval (since in_ns) and the wait before it: runnable from
 * wait_since_ns to in_ns, and, when that wait began with a wakeup, blocked
 * for last_blocked_ns before it. Rewinding further (several switches since
 * `a`) is not possible; the oldest part is then counted as on-CPU time,
 * which is what it most likely was (an event loop busy with earlier
 * requests). */
static __always_inline void rewind(struct kc_snap *b, __u64 a, __u64 now)
{
	__u64 in = b->in_ns, w = b->wait_since_ns, s0;

	if (!b->valid || a >= now)
		return;
	if (!in || a >= in) { /* on CPU since before the arrival */
		sub64(&b->oncpu_ns, now - a);
		return;
	}
	sub64(&b->oncpu_ns, now - in);
	if (!w || w > in) /* no wait on record */
		return;
	sub64(&b->runnable_ns, in - (a > w ? a : w));
	dec32(&b->runnable_count);
	if (a >= w)
		return;
	if (b->last_blocked_ns) { /* woken at w after blocking since s0 */
		s0 = w > b->last_blocked_ns ? w - b->last_blocked_ns : 0;
		sub64(&b->blocked_ns, w - (a > s0 ? a : s0));
		dec32(&b->blocked_count);
		if (a < s0) {
			sub64(&b->oncpu_ns, s0 - a);
			dec32(&b->vol_switches);
		}
	} else { /* preempted at w */
		sub64(&b->oncpu_ns, w - a);
		dec32(&b->invol_switches);
	}
}

/* Whether a socket first touched by a target carries requests. */
static __always_inline bool is_server_side(struct sock *sk)
{
	__u16 family = sk->__sk_common.skc_family;

	if (family == AF_UNIX)
		return true;
	if ((family == AF_INET || family == AF_INET6) && sk->sk_protocol == IPPROTO_TCP) {
		__u32 port = sk->__sk_common.skc_num;
		__u8 *v = bpf_map_lookup_elem(&server_ports, &port);

		return v && *v;
	}
	return false;
}

/* The socket's state if a target uses it, created on a target's first use. */
static __always_inline struct sk_req *sk_state(struct sock *sk, __u32 tgid)
{
	struct sk_req *s;

	/* Every process's socket I/O comes here: turn non-targets away with
	 * one array load, before any helper call. */
	if (!maybe_target_tgid(tgid))
		return NULL;
	s = bpf_sk_storage_get(&sk_reqs, sk, 0, 0);
	if (s) {
		if (s->ignore || (s->tgid != tgid && !is_target_tgid(tgid)))
			return NULL;
		return s;
	}
	if (!is_target_tgid(tgid))
		return NULL;
	s = bpf_sk_storage_get(&sk_reqs, sk, 0, BPF_SK_STORAGE_GET_F_CREATE);
	if (!s)
		return NULL;
	s->tgid = tgid;
	if (!is_server_side(sk)) {
		s->ignore = 1;
		return NULL;
	}
	s->no_stamp = sk->__sk_common.skc_family == AF_UNIX;
	return s;
}

/* Open sampled requests per thread, so that kcounters accounts irq,
 * softirq and fault events only while one is open (abi.h sampled_refs). */
static __always_inline void ref_get(__u32 tid, __u32 tgid)
{
	struct ts_kcounters *e = kc_entry(tid, tgid, true);

	if (e)
		__sync_fetch_and_add(&e->sampled_refs, 1);
}

static __always_inline void ref_put(__u32 tid, __u32 tgid)
{
	struct ts_kcounters *e = kc_entry(tid, tgid, false);

	if (e && *(volatile __u32 *)&e->sampled_refs)
		__sync_fetch_and_sub(&e->sampled_refs, 1);
}

/* Drops the socket's open sampled request without a record: its thread's
 * reference, its window's count. */
static __always_inline void abandon_sampled(struct sk_req *s, __u32 tgid)
{
	s->sampled = 0;
	ref_put(s->ref_tid, tgid);
	open_sampled_add(s->window, -1);
	stat_inc(STAT_ABANDONED);
}

/* Bytes received by the current thread on `sk`: open the socket's request
 * unless one is open. `a` is when the bytes arrived (0: unknown). An
 * unsampled request costs a few loads and stores here: no clock read. */
static __always_inline void open_request(struct sock *sk, __u64 a, bool tcp, __u32 wseq)
{
	struct ts_kcounters *e;
	struct thr_state *t;
	struct sk_req *s;
	__u32 tid, tgid, win = cur_window();
	__u64 id, now;

	id = bpf_get_current_pid_tgid();
	tid = (__u32)id;
	tgid = id >> 32;
	s = sk_state(sk, tgid);
	if (!s)
		return;
	if (s->tid != tid) {
		s->tid = tid;
		s->tgid = tgid;
	}
	if (tcp) {
		/* Only sampled TCP requests come here (tcp_request_sampled). */
		if (s->active && s->open_wseq == wseq && s->window == win)
			return; /* more of the open request: it joins */
		/* Its end was never seen (a reply we missed, or one sent
		 * between burst windows): drop it. */
		if (s->active && s->sampled)
			abandon_sampled(s, tgid);
		s->active = 1;
		s->open_wseq = wseq;
		s->sampled = 1;
	} else {
		/* More of the open request, or pipelined ones: they join it.
		 * One from an earlier burst window ended unseen. */
		if (s->active && s->window == win)
			return;
		if (s->active && s->sampled)
			abandon_sampled(s, tgid);
		s->active = 1;
		s->window = win;
		stat_inc(STAT_SEEN);
		s->sampled = sampled_draw();
		if (!s->sampled)
			return;
	}
	s->window = win;
	open_sampled_add(win, 1);
	now = bpf_ktime_get_ns();
	t = bpf_task_storage_get(&thr_states, bpf_get_current_task_btf(), 0,
	                         BPF_LOCAL_STORAGE_GET_F_CREATE);
	if (!a || a > now || now - a > 1000000000ULL) {
		/* No arrival stamp (a Unix socket): if the thread slept since
		 * its previous request ended (an event loop in epoll_wait),
		 * the wakeup that ended the sleep; else the receive itself. */
		a = now;
		e = kc_entry(tid, tgid, true);
		if (s->no_stamp && t && e && e->blocked_count != t->end_blocked &&
		    t->window == win) {
			__u64 woke = e->wait_since_ns, in = e->switch_in_ns;

			if (woke > t->last_end_ns && in >= woke && woke <= now)
				a = woke;
		}
	}
	s->start_ns = a;
	snapshot(tid, tgid, now, &s->begin);
	rewind(&s->begin, a, now);
	ref_get(tid, tgid);
	s->ref_tid = tid;
	if (t) {
		t->seq++;
		s->request_id = ((__u64)tid << 32) | (__u32)t->seq;
	}
	stat_inc(STAT_SAMPLED);
}

/* TCP: tcp_recvmsg consumed an skb. The tracepoint fires before
 * tcp_rcv_space_adjust refreshes the socket's clock stamp, so
 * tcp_clock_cache still holds when the kernel last processed a segment of
 * this connection: the arrival of the bytes being read (or, for bytes
 * pipelined behind a reply, that reply). MSG_PEEK runs it too: a peek
 * opens the request as a read would, and the read after it joins. */
SEC("tp_btf/tcp_rcv_space_adjust")
int BPF_PROG(tcp_rcv_space_adjust, struct sock *sk)
{
	struct tcp_sock *tp;
	__u32 port, wseq;
	__u8 *srv;

	if (!maybe_target_tgid(bpf_get_current_pid_tgid() >> 32))
		return 0;
	port = sk->__sk_common.skc_num;
	srv = bpf_map_lookup_elem(&server_ports, &port);
	if (!srv || !*srv)
		return 0; /* not the server side of a connection */
	tp = bpf_skc_to_tcp_sock(sk);
	if (!tp)
		return 0;
	wseq = tp->write_seq;
	if (!tcp_request_sampled(sk, wseq))
		return 0; /* the common case: no clock, no socket storage */
	open_request(sk, tp->tcp_clock_cache, true, wseq);
	return 0;
}

/* Other sockets (Unix): a data-bearing receive opens the request. TCP
 * requests were opened by tcp_rcv_space_adjust, inside this receive. */
SEC("tp_btf/sock_recv_length")
int BPF_PROG(sock_recv_length, struct sock *sk, int ret, int flags)
{
	if (ret <= 0 || (flags & MSG_PEEK) || sk->__sk_common.skc_family != AF_UNIX)
		return 0;
	open_request(sk, 0, false, 0);
	return 0;
}

#define D(f) rec->f = end.f - s->begin.f

/* Bytes sent on a socket with an open request: the request ends. */
SEC("tp_btf/sock_send_length")
int BPF_PROG(sock_send_length, struct sock *sk, int ret, int flags)
{
	struct ts_request_record *rec;
	struct kc_snap end;
	struct sk_req *s;
	__u32 tgid, tid, win;
	__u64 id, now;

	if (ret <= 0)
		return 0;
	id = bpf_get_current_pid_tgid();
	tgid = id >> 32;
	if (!maybe_target_tgid(tgid))
		return 0;
	if (sk->__sk_common.skc_family == AF_UNIX) {
		s = sk_state(sk, tgid);
		if (!s || !s->active)
			return 0;
	} else {
		/* TCP: a reply on a server socket. Unsampled requests keep no
		 * state, so unless some sampled request is open, there is
		 * nothing to end. */
		__u32 port = sk->__sk_common.skc_num;
		__u8 *srv = bpf_map_lookup_elem(&server_ports, &port);

		if (sk->sk_protocol != IPPROTO_TCP || !srv || !*srv)
			return 0;
		stat_inc(STAT_SEEN);
		if (!any_open_sampled())
			return 0;
		s = bpf_sk_storage_get(&sk_reqs, sk, 0, 0);
		if (!s || s->ignore || !s->active || !s->sampled || s->tgid != tgid)
			return 0;
	}
	s->active = 0;
	if (!s->sampled && !s->no_stamp)
		return 0;
	win = cur_window();
	now = bpf_ktime_get_ns();
	if (s->no_stamp) {
		/* The fallback start needs the end of the thread's previous
		 * request. */
		struct thr_state *t = bpf_task_storage_get(&thr_states, bpf_get_current_task_btf(),
		                                           0, BPF_LOCAL_STORAGE_GET_F_CREATE);
		struct ts_kcounters *e = kc_entry((__u32)id, tgid, false);

		if (t) {
			t->last_end_ns = now;
			t->end_blocked = e ? e->blocked_count : 0;
			t->window = win;
		}
	}
	if (!s->sampled)
		return 0;
	if (s->window != win) {
		/* Opened in an earlier burst window: its reply was not seen. */
		abandon_sampled(s, tgid);
		return 0;
	}
	s->sampled = 0;
	open_sampled_add(win, -1);
	tid = s->ref_tid; /* the reader's counters; normally the sender too */
	snapshot(tid, tgid, now, &end);
	ref_put(tid, tgid);
	rec = bpf_ringbuf_reserve(&records, sizeof(*rec), 0);
	if (!rec) {
		stat_inc(STAT_DROPS);
		return 0;
	}
	__builtin_memset(rec, 0, sizeof(*rec));
	rec->request_id = s->request_id;
	rec->start_ns = s->start_ns;
	rec->latency_ns = now > s->start_ns ? now - s->start_ns : 0;
	rec->tid = tid;
	rec->kind = 0;
	rec->flags = TS_REC_SAMPLED | TS_REC_INFERRED;
	rec->cpu = bpf_get_smp_processor_id();
	if (end.valid && s->begin.valid) {
		rec->flags |= TS_REC_COUNTERS;
		if (end.valid == 2 || s->begin.valid == 2) {
			rec->flags |= TS_REC_TORN;
			stat_inc(STAT_TORN);
		}
		D(oncpu_ns);
		D(runnable_ns);
		D(blocked_ns);
		D(irq_ns);
		D(softirq_ns);
		D(runnable_count);
		D(blocked_count);
		D(irq_count);
		D(softirq_count);
		D(fault_user_count);
		D(fault_kernel_count);
		D(migrations);
		D(vol_switches);
		D(invol_switches);
	}
	/* No wakeup per record: the agent drains on its own period (at 1%
	 * sampling a wakeup per record is a context switch per record on a
	 * CPU the server needs). Wake it only once a quarter of the ring is
	 * waiting. */
	{
		__u64 avail = bpf_ringbuf_query(&records, BPF_RB_AVAIL_DATA);
		__u64 size = bpf_ringbuf_query(&records, BPF_RB_RING_SIZE);

		bpf_ringbuf_submit(rec, avail > size / 4 ? BPF_RB_FORCE_WAKEUP : BPF_RB_NO_WAKEUP);
	}
	return 0;
}

/* A socket starts listening (any process): its port is a server port.
 * A watched connection that closes with a request open (the client hung up
 * before the reply, or no reply comes) drops the request, so that its
 * thread's sampled_refs does not stay up and keep interrupt accounting on.
 * Runs on connection state changes only: rare. */
SEC("tp_btf/inet_sock_set_state")
int BPF_PROG(inet_sock_set_state, struct sock *sk, int oldstate, int newstate)
{
	struct sk_req *s;
	__u32 port;
	__u8 one = 1;

	if (newstate == TCP_LISTEN) {
		port = sk->__sk_common.skc_num;
		bpf_map_update_elem(&server_ports, &port, &one, BPF_ANY);
		return 0;
	}
	if (newstate != TCP_FIN_WAIT1 && newstate != TCP_LAST_ACK && newstate != TCP_CLOSE)
		return 0;
	s = bpf_sk_storage_get(&sk_reqs, sk, 0, 0);
	if (!s || !s->active)
		return 0;
	s->active = 0;
	if (s->sampled)
		abandon_sampled(s, s->tgid);
	return 0;
}
