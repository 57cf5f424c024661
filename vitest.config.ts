import { defineConfig } from "vitest/config";

export default defineConfig({
  test: {
    include: ["test/**/*.test.ts", "wire/test/**/*.test.ts", "agent-sdk/test/**/*.test.ts", "agent-sdk/python/test/**/*.test.ts"],
    globalSetup: ["test/support/global-setup.ts"],
    // Each test file gets its own migrated schema, so files can run in parallel safely.
    fileParallelism: true,
    testTimeout: 30_000,
    hookTimeout: 60_000,
  },
});
