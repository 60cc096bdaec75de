/* sample.c — which requests are sampled.
 *
 * Each thread keeps a countdown: the number of requests until its next
 * sampled one. For a rate p the gaps between sampled requests are
 * geometric, G = 1 + floor(ln U / ln(1 - p)), U uniform in (0, 1], which
 * gives every request probability p, independently, while the unsampled
 * path only decrements and tests a thread-local counter.
 *
 * The rate is the agent's override (header.sample_ppm_agent) when non-zero,
 * else the runtime's own. It is read only when a countdown is drawn. With
 * rate 0 the countdown is TS_COUNTDOWN_IDLE and expires without sampling,
 * so an agent that raises the rate is noticed within that many requests.
 *
 * The PRNG is xorshift64*, seeded per thread from the tid and the clock:
 * deterministic enough to debug, different across threads and runs.
 * ln() is computed here (no libm dependency for static users).
 */
#include "internal.h"

uint32_t ts_current_ppm(void)
{
	if (!ts_proc.enabled)
		return 0;
	uint32_t agent = __atomic_load_n(&ts_proc.hdr->sample_ppm_agent, __ATOMIC_RELAXED);
	uint32_t ppm = agent ? agent : ts_proc.sample_ppm;
	return ppm > TS_PPM ? TS_PPM : ppm;
}

static uint64_t rng_next(struct ts_thread *t)
{
	uint64_t x = t->rng;
	x ^= x >> 12;
	x ^= x << 25;
	x ^= x >> 27;
	t->rng = x;
	return x * 0x2545F4914F6CDD1Dull;
}

void ts_sample_seed(struct ts_thread *t)
{
	uint64_t s = ts_now_ns() ^ ((uint64_t)t->tid * 0x9E3779B97F4A7C15ull);
	t->rng = s ? s : 0x1234567;
	t->countdown = 0;
	ts_sample_redraw(t);
}

/* Natural log for x > 0: x = m * 2^e with m in [sqrt(1/2), sqrt(2)), then
 * ln m = 2 atanh(s), s = (m - 1) / (m + 1), |s| < 0.172, six odd terms
 * (relative error < 1e-9). m - 1 is exact near 1, so ln(1 - p) keeps its
 * precision for tiny p. */
double ts_ln(double x)
{
	union {
		double d;
		uint64_t u;
	} v = {.d = x};
	int e = (int)((v.u >> 52) & 0x7ff) - 1023;
	v.u = (v.u & 0x000fffffffffffffull) | 0x3ff0000000000000ull;
	if (v.d > 1.41421356237309505) {
		v.d *= 0.5;
		e++;
	}
	double s = (v.d - 1.0) / (v.d + 1.0), s2 = s * s;
	double series = 2.0 / 11;
	series = 2.0 / 9 + s2 * series;
	series = 2.0 / 7 + s2 * series;
	series = 2.0 / 5 + s2 * series;
	series = 2.0 / 3 + s2 * series;
	series = 2.0 + s2 * series;
	return e * 0.69314718055994530942 + s * series;
}

/* Draw the gap to the next sampled request. */
void ts_sample_redraw(struct ts_thread *t)
{
	uint32_t ppm = ts_current_ppm();
	t->sample_at_zero = ppm != 0;
	if (ppm == 0) {
		t->countdown = TS_COUNTDOWN_IDLE;
	} else if (ppm >= TS_PPM) {
		t->countdown = 1;
	} else {
		double u = ((rng_next(t) >> 11) + 1) * (1.0 / 9007199254740992.0);
		double g = 1.0 + ts_ln(u) / ts_ln(1.0 - ppm / (double)TS_PPM);
		t->countdown = g >= (double)TS_COUNTDOWN_CAP ? TS_COUNTDOWN_CAP : (int64_t)g;
	}
}
