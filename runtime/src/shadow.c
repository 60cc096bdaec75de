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
 * The stack is a seqlock: `gen` is odd while the owner changes it. Each hook
 * adds 1 at its start and 1 at its end, with single `add` instructions, so a
 * signal handler on the same thread can never see half of an increment. A
 * hook that finds `gen` already odd has interrupted another hook (it runs in
 * a signal handler): it adds 2 instead, so that `gen` stays odd until the
 * interrupted hook finishes. `depth` is raised before the frame is written,
 * so a nested hook never overwrites the frame being written. A frame's id is
 * the gen at its entry, unique per call on the thread, which tells apart
 * two calls of a function from one call site in a loop.
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
 * Cost: see the hot paths below; no clock, no lock-prefixed atomics, no
 * call. TAILSCOPE_FN_CLOCK=1 adds a
 * clock_gettime per entry (about 30 ns here) for exact start times.
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
 * compiler barrier is all a release store needs). */
static NOINST inline void gen_store(struct ts_shadow_stack *s, uint64_t g)
{
	__asm__ volatile("" ::: "memory");
	s->gen = g;
	__asm__ volatile("" ::: "memory");
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
	uint64_t g = s->gen;
	if (TS_UNLIKELY(g & 1))
		return; /* a signal interrupted a hook: skip */
	gen_store(s, g + 1);
	if (TS_LIKELY(d < TS_SHADOW_DEPTH)) {
		struct ts_frame *f = &s->frames[d];
		f->fn = fn;
		f->site = site;
		f->id = g + 1;
		f->sp = sp;
		/* Unstamped processes never write entry_ns: it stays 0. */
		if (stamp)
			f->entry_ns = entry_ns;
	} else {
		s->truncated++;
	}
	s->depth = d + 1;
	gen_store(s, g + 2);
}

/* Everything but the common case: first call on the thread, stamped
 * entries, dead frames on top. */
static NOINST __attribute__((noinline)) void enter_slow(void *fn, void *site, uintptr_t sp)
{
	struct ts_thread *t = &ts_self;
	struct ts_shadow_stack *s = shadow_attach(t);
	uint64_t entry_ns = t->shadow ? 0 : now_ns();
	uint32_t d = s->depth;
	uint64_t g = s->gen;
	if (shadow_top_dead(s, d, sp, (uint64_t)(uintptr_t)site) && !(g & 1)) {
		gen_store(s, g + 1);
		uint32_t n = d < TS_SHADOW_DEPTH ? d : TS_SHADOW_DEPTH;
		while (n > 0 && frame_dead(&s->frames[n - 1], sp, (uint64_t)(uintptr_t)site))
			n--;
		s->resyncs += d - n;
		s->depth = n;
		gen_store(s, g + 2);
	}
	shadow_push(s, s->depth, (uint64_t)(uintptr_t)fn, (uint64_t)(uintptr_t)site, sp, 1,
	            entry_ns);
}

/* Hot path: 20 instructions (x86-64, gcc -O2 -fPIC), a leaf: TLS load,
 * null test, depth load, dead-frame test, two gen adds, five stores. */
NOINST void __cyg_profile_func_enter(void *fn, void *site)
{
	uintptr_t sp;
	__asm__("mov %%rsp, %0" : "=r"(sp));
	struct ts_shadow_stack *s = ts_self.shadow;
	if (TS_UNLIKELY(!s)) {
		enter_slow(fn, site, sp);
		return;
	}
	uint32_t d = s->depth;
	uint32_t top = d < TS_SHADOW_DEPTH ? d : TS_SHADOW_DEPTH;
	if (TS_UNLIKELY(top && s->frames[top - 1].sp <= sp) &&
	    frame_dead(&s->frames[top - 1], sp, (uint64_t)(uintptr_t)site)) {
		enter_slow(fn, site, sp);
		return;
	}
	shadow_push(s, d, (uint64_t)(uintptr_t)fn, (uint64_t)(uintptr_t)site, sp, 0, 0);
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

/* Hot path: 15 instructions, a leaf. */
NOINST void __cyg_profile_func_exit(void *fn, void *site)
{
	(void)site;
	struct ts_shadow_stack *s = ts_self.shadow;
	if (TS_UNLIKELY(!s))
		s = ts_self.shadow_slow;
	if (TS_UNLIKELY(!s))
		return;
	uint64_t g = s->gen;
	if (TS_UNLIKELY(g & 1))
		return; /* a signal interrupted a hook: skip */
	gen_store(s, g + 1);
	uint32_t d = s->depth;
	if (TS_LIKELY(d - 1 < TS_SHADOW_DEPTH && s->frames[d - 1].fn == (uint64_t)(uintptr_t)fn))
		s->depth = d - 1;
	else if (d > TS_SHADOW_DEPTH)
		s->depth = d - 1; /* truncated zone: nothing stored to check */
	else if (d > 0)
		shadow_exit_resync(s, d, (uint64_t)(uintptr_t)fn);
	gen_store(s, g + 2);
}
