/**
 * How a call was refused, for every suite (the kit re-exports both; the wire package's tests import
 * this module alone, which loads no daemon):
 *
 * - `codeOf(call)` is the gRPC code a call was refused with ("ok" when it was not);
 * - `refusal(call)` is the error itself, and fails the test when the call succeeded.
 */
import { ConnectError, type Code } from "@connectrpc/connect";

/** The gRPC code a call was refused with, or "ok" when it succeeded. */
export async function codeOf(call: Promise<unknown>): Promise<Code | "ok"> {
  try {
    await call;
    return "ok";
  } catch (err) {
    return ConnectError.from(err).code;
  }
}

/** The error a call was refused with; fails the test when the call succeeded. */
export async function refusal(call: Promise<unknown>): Promise<ConnectError> {
  try {
    await call;
  } catch (err) {
    return ConnectError.from(err);
  }
  throw new Error("expected the call to be refused, but it succeeded");
}
