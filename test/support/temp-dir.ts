import { chmod, mkdtemp, rm } from "node:fs/promises";
import os from "node:os";
import path from "node:path";

/**
 * A fresh directory under the system temp dir. mkdtemp makes it 0700, but when the tests run as root
 * the embedded Postgres runs as the "postgres" user, which must be able to reach a data directory
 * inside it, so it is opened to 0755.
 */
export async function makeTempDir(prefix: string): Promise<string> {
  const dir = await mkdtemp(path.join(os.tmpdir(), `${prefix}-`));
  await chmod(dir, 0o755);
  return dir;
}

export async function removeTempDir(dir: string): Promise<void> {
  await rm(dir, { recursive: true, force: true });
}
