import { allLayouts, compareLayouts, compareSTypes, compileProbe } from "../cases/layout.ts";

declare const Deno: any;
Deno.test("struct layouts against vulkan_core.h under Deno", () => {
  const layouts = allLayouts();
  const problems = [...compareLayouts(layouts, compileProbe(layouts)), ...compareSTypes(layouts)];
  if (layouts.length < 60 || problems.length) throw new Error(`layout problems:\n${problems.join("\n")}`);
});
