/**
 * When a server stream ends, and with what code, for the interceptors that observe calls (spans,
 * metrics): the stream is wrapped so that `ended` is called once, as it ends, with the error it
 * ended with, or undefined for OK.
 *
 * Two ends are CANCELLED though no error was thrown: the server stops reading the stream before
 * its end (the client went away mid-stream), and a handler that ends it cleanly because the call's
 * signal aborted (the caller went away, or the server stops), which is how handlers such as
 * Health.Watch take that cue. The caller got CANCELLED either way.
 */
import { Code, ConnectError } from "@connectrpc/connect";

export function observeStreamEnd<T>(stream: AsyncIterable<T>, signal: AbortSignal, ended: (err: unknown) => void): AsyncIterable<T> {
  return (async function* () {
    let outcome: unknown = new ConnectError("the stream was not read to its end", Code.Canceled);
    try {
      yield* stream;
      outcome = signal.aborted ? new ConnectError("the call was cancelled", Code.Canceled) : undefined;
    } catch (err) {
      outcome = err;
      throw err;
    } finally {
      ended(outcome);
    }
  })();
}
