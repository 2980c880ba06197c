import { expect, test } from "bun:test";
import { saxpyRoundTrip } from "./cases/roundtrip.ts";

for (const n of [1, 63, 64, 65, 1000, 1 << 20]) {
  test(`saxpy round trip on the real driver, n=${n}, every element and the sentinels`, () => saxpyRoundTrip(n));
}

test("negative control: a wrong expected result is reported", () => {
  // saxpy with b = NaN cannot equal the finite expectation path: proves the element check bites.
  expect(() => saxpyRoundTrip(16, 2, Number.NaN)).toThrow(/y\[0\]/);
});
