import type { NativeArena } from "../ffi/index.ts";
import { check } from "./errors.ts";
import type { StructLayout, Values } from "./layout.ts";

/**
 * The "call twice" pattern: ask for the count, then fill an array of `layout`, each item's defaults
 * (its sType) written first, as Vulkan asks of output structs. `call` gets the addresses of the
 * count and of the array (0n on the first call). VK_INCOMPLETE retries.
 */
export function enumerate(a: NativeArena, layout: StructLayout, call: (count: bigint, items: bigint) => number, name: string): Values[] {
  for (;;) {
    using _ = a.scope();
    const count = a.alloc(4, 4);
    check(name, call(a.address(count), 0n));
    const n = a.view.getUint32(count, true);
    if (n === 0) return [];
    const items = a.alloc(layout.size * n, layout.align);
    for (let i = 0; i < n; i++) layout.write(a.view, items + i * layout.size, {});
    const r = check(name, call(a.address(count), a.address(items)));
    if (r === 5 /* VK_INCOMPLETE */) continue;
    const got = a.view.getUint32(count, true);
    return Array.from({ length: got }, (_, i) => layout.read(a.view, items + i * layout.size));
  }
}
