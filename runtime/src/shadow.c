/* shadow.c — per-thread shadow stacks for function-level latency (LDB).
 *
 * Build a service with -finstrument-functions (see `tailscope flags`) and
 * the compiler calls __cyg_profile_func_enter/exit around every function.
 * The hooks keep, in the thread's slot of the shared region, a stack of the
 * live calls: function, call site, a per-call id, the stack address and
 * (optionally) the entry time. The agent's observer scans these stacks from
 * another core; it times a call from when its frame first appears to when
 * it is gone (LDB ch. 3, with shadow stacks instead of frame pointers).
 *
 * The stack is a seqlock for pushes: `gen` is odd while the owner writes a
 * frame. A push adds 1 at its start and 1 at its end, each a single `add`
 * instruction to memory (no lock prefix: only the owning thread writes, and
 * a signal handler on that thread runs between instructions, so it can
 * never see half of an increment). A hook that finds `gen` already odd has
 * interrupted another hook (it runs in a signal handler): it does not push,
 * and counts the call in `skipped`. `depth` is raised after the frame is
 * written. A handler that lands before a push's first add sees an even gen
 * and the depth the push read: it pushes there and pops back to that depth
 * before the interrupted hook resumes. A frame's id is the gen at its
 * entry (odd), unique per call on the thread, which tells apart two calls
 * of a function from one call site in a loop.
 *
 * A pop is one 4-byte store of `depth - 1` and leaves `gen` alone: frames
 * below the depth are not touched, so a reader that copied the stack during
 * a pop holds the state from just before it, which is consistent. The
 * observer therefore treats (gen, depth) as the version: a change of either
 * means something changed, and a push in between always changes gen.
 * Pops that resynchronise (below) change more than depth and go through the
 * seqlock like a push.
 *
 * Memory order: x86-64 is TSO (stores become visible in program order, loads
 * are not reordered with older loads), so the writer needs only compiler
 * barriers between its stores; the reader (crates/agent/src/observer.rs)
 * reads gen, then the copy, then gen again with acquire loads.
 *
 * Resynchronisation. longjmp and C exceptions leave frames without exits.
 * On entry, frames whose stack address is below the caller's current one
 * are dead (a live ancestor's is above) and are dropped; so is one at the
 * same address with another call site (a sibling after a longjmp), while
 * a function inlined into its caller runs its hooks in the caller's frame
 * with the caller's call site, and stays. On exit,
 * a function that is not on top pops down to its own frame. Both are
 * counted in `resyncs`. Calls deeper than TS_SHADOW_DEPTH only change
 * `depth` and are counted in `truncated`.
 *
 * Cost (x86-64, gcc -O2, bench/ldb): about 2.5 ns per call (enter + exit)
 * over an uninstrumented call, of which the two calls to empty hooks are
 * about 1.5 ns. No clock, no lock-prefixed atomics, no call, no branch taken
 * in the common case. TAILSCOPE_FN_CLOCK=1 adds a clock_gettime per entry
 * (about 40 ns on this VM) for exact start times; the observer does not need
 * it (it times a call from when it first sees the frame, Shim style).
 */
#define _GNU_SOURCE
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "internal.h"

#define NOINST __attribute__((no_instrument_function))

/* Muted threads (no slot, runtime disabled, thread exited) write here. Its
 * contents are never read; indices are bounded like everywhere else. */
static struct ts_shadow_stack ts_shadow_sink;

/* A plain store, ordered after everything before it (x86 is TSO: a
 * compiler barrier is all a release store needs). Only for resets, which no
 * hook on this thread can interrupt with a push of its own. */
static NOINST inline void gen_store(struct ts_shadow_stack *s, uint64_t g)
{
	__asm__ volatile("" ::: "memory");
	s->gen = g;
	__asm__ volatile("" ::: "memory");
}

/* gen += 1 as one instruction (see the top: signal-safe, no lock prefix),
 * ordered after the stores before it and before the stores after it. */
static NOINST inline void gen_bump(struct ts_shadow_stack *s)
{
	__asm__ volatile("addq $1, %0" : "+m"(s->gen) : : "memory");
}

/* One more skipped call, as one instruction (nested handlers may race). */
static NOINST inline void count_skip(struct ts_shadow_stack *s)
{
	__asm__ volatile("addq $1, %0" : "+m"(s->skipped) : : "memory");
}

static NOINST uint64_t now_ns(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

/* First hook on this thread: find its shadow stack. Threads that stamp
 * entries (TAILSCOPE_FN_CLOCK=1) keep `shadow` NULL, so every entry comes
 * here; `shadow_slow` is their stack. */
static NOINST struct ts_shadow_stack *shadow_attach(struct ts_thread *t)
{
	if (t->shadow_slow)
		return t->shadow_slow;
	if (t->in_attach)
		return &ts_shadow_sink;
	t->in_attach = 1;
	struct ts_shadow_stack *s = &ts_shadow_sink;
	if (t->state == TS_THREAD_READY || ts_thread_init(t)) {
		s = &t->slot->shadow;
		uint32_t feat = TS_FEAT_FN_HOOKS;
		if (ts_proc.fn_clock)
			feat |= TS_FEAT_FN_CLOCK;
		__atomic_fetch_or(&ts_proc.hdr->features, feat, __ATOMIC_RELAXED);
	}
	t->shadow_slow = s;
	t->shadow = ts_proc.fn_clock ? NULL : s;
	t->in_attach = 0;
	return s;
}

NOINST void ts_shadow_reset(struct ts_shadow_stack *s)
{
	uint64_t g = (s->gen + 2) & ~1ull;
	gen_store(s, g + 1);
	s->depth = 0;
	gen_store(s, g + 2);
}

NOINST void ts_shadow_detach(struct ts_thread *t)
{
	t->shadow = &ts_shadow_sink;
	t->shadow_slow = &ts_shadow_sink;
}

/* Frames below the caller's stack address are dead (skipped by a longjmp
 * or an exception): a live ancestor's is above, or equal when inlined. */
static NOINST inline int frame_dead(const struct ts_frame *f, uintptr_t sp, uint64_t site)
{
	/* Equal stack addresses: a function inlined into the frame's function
	 * (its hooks pass the same call site), or a sibling called after a
	 * longjmp out of the frame (a different call site). */
	return f->sp < sp || (f->sp == sp && f->site != site);
}

static NOINST inline int shadow_top_dead(const struct ts_shadow_stack *s, uint32_t d, uintptr_t sp,
                                         uint64_t site)
{
	uint32_t top = d < TS_SHADOW_DEPTH ? d : TS_SHADOW_DEPTH;
	return top && frame_dead(&s->frames[top - 1], sp, site);
}

/* Push one frame. The caller checked that no dead frame is on top. */
static NOINST inline void shadow_push(struct ts_shadow_stack *s, uint32_t d, uint64_t fn,
                                      uint64_t site, uintptr_t sp, int stamp, uint64_t entry_ns)
{
	if (TS_UNLIKELY(s->gen & 1)) {
		count_skip(s); /* a signal interrupted a hook: skip */
		return;
	}
	gen_bump(s);
	uint64_t id = s->gen; /* after the add: a handler landing before it pushed and popped */
	if (TS_LIKELY(d < TS_SHADOW_DEPTH)) {
		struct ts_frame *f = &s->frames[d];
		f->fn = fn;
		f->site = site;
		f->id = id;
		f->sp = sp;
		/* Unstamped processes never write entry_ns: it stays 0. */
		if (stamp)
			f->entry_ns = entry_ns;
	} else {
		s->truncated++;
	}
	s->depth = d + 1;
	gen_bump(s);
}

/* Everything but the common case: first call on the thread, stamped
 * entries, dead frames on top. */
static NOINST __attribute__((noinline)) void enter_slow(void *fn, void *site, uintptr_t sp)
{
	struct ts_thread *t = &ts_self;
	struct ts_shadow_stack *s = shadow_attach(t);
	uint64_t entry_ns = t->shadow ? 0 : now_ns();
	uint32_t d = s->depth;
	if (shadow_top_dead(s, d, sp, (uint64_t)(uintptr_t)site) && !(s->gen & 1)) {
		gen_bump(s);
		uint32_t n = d < TS_SHADOW_DEPTH ? d : TS_SHADOW_DEPTH;
		while (n > 0 && frame_dead(&s->frames[n - 1], sp, (uint64_t)(uintptr_t)site))
			n--;
		s->resyncs += d - n;
		s->depth = n;
		gen_bump(s);
	}
	shadow_push(s, s->depth, (uint64_t)(uintptr_t)fn, (uint64_t)(uintptr_t)site, sp, 1,
	            entry_ns);
}

/* Hot path: 30 instructions (x86-64, gcc -O2), a leaf, no taken branch:
 * TLS load, null test, depth load, top frame's stack address against ours
 * (the dead-frame test; a live caller's is above), gen load and odd test,
 * two gen adds, the id load, four frame stores and the depth store. */
NOINST void __cyg_profile_func_enter(void *fn, void *site)
{
	uintptr_t sp;
	__asm__("mov %%rsp, %0" : "=r"(sp));
	struct ts_shadow_stack *s = ts_self.shadow;
	if (TS_UNLIKELY(!s))
		goto slow;
	uint32_t d = s->depth;
	if (TS_LIKELY(d - 1 < TS_SHADOW_DEPTH)) { /* 1..TS_SHADOW_DEPTH frames stored */
		if (TS_UNLIKELY(s->frames[d - 1].sp <= sp))
			goto check;
	} else if (d != 0) { /* truncated zone */
		goto check;
	}
	shadow_push(s, d, (uint64_t)(uintptr_t)fn, (uint64_t)(uintptr_t)site, sp, 0, 0);
	return;
check: /* at or above the top frame's stack address: inlined callee, or dead frames */
	if (!shadow_top_dead(s, d, sp, (uint64_t)(uintptr_t)site)) {
		shadow_push(s, d, (uint64_t)(uintptr_t)fn, (uint64_t)(uintptr_t)site, sp, 0, 0);
		return;
	}
slow:
	enter_slow(fn, site, sp);
}

/* The exiting function is not on top: pop down to it, or (not found, e.g.
 * entered before a fork or a reset) leave the stack alone. */
static NOINST __attribute__((noinline)) void shadow_exit_resync(struct ts_shadow_stack *s,
                                                                uint32_t d, uint64_t fn)
{
	uint32_t n = d < TS_SHADOW_DEPTH ? d : TS_SHADOW_DEPTH;
	while (n > 0 && s->frames[n - 1].fn != fn)
		n--;
	if (n == 0)
		return;
	s->resyncs += d - n;
	s->depth = n - 1;
}

/* Hot path: 15 instructions, a leaf: TLS load, null test, gen load and odd
 * test, depth load, bound test, the top frame's function against ours, and
 * the depth store. No gen change (see the top). */
NOINST void __cyg_profile_func_exit(void *fn, void *site)
{
	(void)site;
	struct ts_shadow_stack *s = ts_self.shadow;
	if (TS_UNLIKELY(!s))
		s = ts_self.shadow_slow;
	if (TS_UNLIKELY(!s))
		return;
	if (TS_UNLIKELY(s->gen & 1))
		return; /* a signal interrupted a hook: its entry was skipped too */
	uint32_t d = s->depth;
	if (TS_LIKELY(d - 1 < TS_SHADOW_DEPTH && s->frames[d - 1].fn == (uint64_t)(uintptr_t)fn)) {
		__asm__ volatile("" ::: "memory");
		s->depth = d - 1;
		return;
	}
	if (d > TS_SHADOW_DEPTH) {
		s->depth = d - 1; /* truncated zone: nothing stored to check */
		return;
	}
	if (d == 0)
		return;
	gen_bump(s);
	shadow_exit_resync(s, d, (uint64_t)(uintptr_t)fn);
	gen_bump(s);
}
