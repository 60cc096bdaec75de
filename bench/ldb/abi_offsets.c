/* abi_offsets.c — prints the region offsets bench/ldb/run.py needs to read
 * shadow-stack generations (calls per request) from /dev/shm/tailscope.<pid>. */
#include <stddef.h>
#include <stdio.h>

#include "tailscope/abi.h"

int main(void)
{
	printf("header_size %zu\n", sizeof(struct ts_region_header));
	printf("slot_size %zu\n", sizeof(struct ts_thread_slot));
	printf("slots_used %zu\n", offsetof(struct ts_region_header, slots_used));
	printf("state %zu\n", offsetof(struct ts_thread_slot, state));
	printf("tid %zu\n", offsetof(struct ts_thread_slot, tid));
	printf("shadow_gen %zu\n",
	       offsetof(struct ts_thread_slot, shadow) + offsetof(struct ts_shadow_stack, gen));
	printf("ev_head %zu\n", offsetof(struct ts_thread_slot, ev_head));
	return 0;
}
