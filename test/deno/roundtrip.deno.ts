import { saxpyRoundTrip } from "../cases/roundtrip.ts";

declare const Deno: any;
for (const n of [1, 65, 1000, 1 << 20]) {
  Deno.test(`saxpy round trip under Deno, n=${n}`, () => saxpyRoundTrip(n));
}
