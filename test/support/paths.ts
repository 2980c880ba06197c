import { fileURLToPath } from "node:url";
export const repoRoot = fileURLToPath(new URL("../../", import.meta.url));
export const shaderPath = (name: string) => `${repoRoot}shaders/${name}.spv`;
