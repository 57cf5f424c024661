/**
 * aiflowctl's words for a failed connection (src/cli/ctl/errors.ts), for the errors a call can end
 * with, which the end-to-end tests meet only as the network happens to deliver them: h2c to a TLS
 * port closes the connection or resets it, and both say the same thing.
 */
import { Code, ConnectError } from "@connectrpc/connect";
import { describe, expect, it } from "vitest";
import type { Command } from "../src/cli/ctl/command.js";
import { explain } from "../src/cli/ctl/errors.js";

const command: Command = { name: "agents", usage: [], flags: [], role: "ops", run: async () => 0 };
const at = { address: "127.0.0.1:7400" };

describe("aiflowctl's words for a failed connection", () => {
  it.each([
    ["a close before any answer", new ConnectError("http/2 stream closed with error code CANCEL (0x8)", Code.Canceled)],
    ["a reset before any answer", new ConnectError("read ECONNRESET", Code.Unavailable)],
  ])("h2c to a TLS port, %s: says to give the CA", (_what, err) => {
    expect(explain(err, command, at)).toEqual({
      message: "127.0.0.1:7400 closed the connection without answering: if it serves TLS, give --tls-ca FILE (or AIFLOW_TLS_CA) (--address, AIFLOW_ADDRESS)",
      exit: 1,
    });
  });

  it("a server that answers, but not as gRPC: says it may be the wrong address", () => {
    expect(explain(new ConnectError("Protocol error", Code.Internal), command, at).message).toBe(
      "127.0.0.1:7400 did not answer as aiflowd's gRPC port does (Protocol error): is that the right address? (--address, AIFLOW_ADDRESS)",
    );
  });
});
