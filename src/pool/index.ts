/** Expert pool: slab suballocator, expert cache, eviction policies, routing history. */
export * from "./errors.ts";
export * from "./suballocator.ts";
export * from "./policy.ts";
export * from "./history.ts";
export * from "./cache.ts";
export * from "./host-memory.ts";
