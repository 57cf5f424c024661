/**
 * The Python library's own unit tests (test/test_units.py, stdlib unittest) and its packaging: the
 * wheel pip builds offline from pyproject.toml holds the library, its py.typed marker and the
 * generated modules, and imports from where it is installed, away from the sources.
 */
import { execFile } from "node:child_process";
import { cpSync, mkdtempSync, readdirSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { fileURLToPath } from "node:url";
import { promisify } from "node:util";
import { afterAll, describe, expect, it } from "vitest";
import { PYTHON, PYTHONPATH } from "./python-agent.js";

const run = promisify(execFile);
const PKG = fileURLToPath(new URL("..", import.meta.url));
const scratch = mkdtempSync(join(tmpdir(), "aiflow-py-"));
afterAll(() => rmSync(scratch, { recursive: true, force: true }));

describe("the Python library", () => {
  it("passes its unit tests", async () => {
    const { stderr } = await run(PYTHON, ["-m", "unittest", "discover", "-s", "test", "-p", "test_*.py", "-v"], { cwd: PKG, env: { ...process.env, PYTHONPATH } });
    expect(stderr).toMatch(/\nOK\s*$/);
    expect(stderr).toMatch(/Ran \d+ tests/);
  });

  it("builds as a wheel offline that installs and imports away from its sources, typed", async () => {
    // Built from a copy: pip builds in the tree it is given (build/, *.egg-info).
    const tree = join(scratch, "tree");
    for (const part of ["pyproject.toml", "README.md", "src", "gen"]) cpSync(join(PKG, part), join(tree, part), { recursive: true });
    const wheels = join(scratch, "wheels");
    const site = join(scratch, "site");
    // --no-build-isolation: Debian's setuptools builds it; nothing is fetched.
    await run(PYTHON, ["-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--no-index", "-w", wheels, tree], { cwd: scratch, env: { ...process.env, PIP_NO_CACHE_DIR: "1" } });
    const [wheel] = readdirSync(wheels);
    expect(wheel).toMatch(/^aiflow_agent-\d+\.\d+\.\d+-py3-none-any\.whl$/);
    await run(PYTHON, ["-m", "pip", "install", "--no-deps", "--no-index", "--target", site, join(wheels, wheel!)], { cwd: scratch });
    const probe = [
      "import aiflow_agent, importlib.resources as r",
      "from aiflow.cluster.v1 import agent_pb2_grpc, queue_pb2",
      "assert aiflow_agent.__file__.startswith(sys.argv[1]), aiflow_agent.__file__",
      "assert r.files('aiflow_agent').joinpath('py.typed').is_file()",
      "print(aiflow_agent.__version__, hasattr(agent_pb2_grpc, 'AgentServiceStub'))",
    ].join("\n");
    const { stdout } = await run(PYTHON, ["-c", `import sys\n${probe}`, site], { cwd: scratch, env: { ...process.env, PYTHONPATH: site } });
    expect(stdout.trim()).toMatch(/^\d+\.\d+\.\d+ True$/);
  });
});
