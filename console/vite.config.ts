/**
 * Builds the operators' console (console/) into dist/console, which the daemon serves at /console/
 * (src/server/console.ts). Everything is bundled: no CDN, nothing fetched at run time. No plugin is
 * needed: the views are Preact with htm's tagged templates, which are plain JavaScript.
 */
import { fileURLToPath } from "node:url";
import { defineConfig } from "vite";

export default defineConfig({
  root: fileURLToPath(new URL(".", import.meta.url)),
  base: "/console/",
  logLevel: "warn",
  build: {
    outDir: fileURLToPath(new URL("../dist/console", import.meta.url)),
    emptyOutDir: true,
    // The Content-Security-Policy allows no inline script or style: keep every asset a file.
    assetsInlineLimit: 0,
    modulePreload: { polyfill: false },
    target: "es2022",
    reportCompressedSize: false,
  },
});
