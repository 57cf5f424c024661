/**
 * Where the Python agent library runs from, for the demo, the bench and the tests: Debian's
 * interpreter (the one python3-grpcio and python3-protobuf install for; the python3 on PATH may be
 * another, pyenv's, without them) with the library's sources and generated modules on its path.
 */
import { execFileSync } from "node:child_process";
import { fileURLToPath } from "node:url";

export const PYTHON = process.env.AIFLOW_PYTHON ?? "/usr/bin/python3";
export const PYTHON_PKG = fileURLToPath(new URL("../agent-sdk/python/", import.meta.url));
export const PYTHONPATH = `${PYTHON_PKG}src:${PYTHON_PKG}gen`;

/** The environment a Python agent runs in. */
export const pythonEnv = (): NodeJS.ProcessEnv => ({ ...process.env, PYTHONPATH, PYTHONUNBUFFERED: "1", GRPC_VERBOSITY: "NONE" });

/** Whether the library can run here: the interpreter is there and imports grpcio and protobuf. */
export function pythonAvailable(): boolean {
  try {
    execFileSync(PYTHON, ["-c", "import grpc, google.protobuf, aiflow_agent"], { env: pythonEnv(), stdio: "ignore" });
    return true;
  } catch {
    return false;
  }
}
