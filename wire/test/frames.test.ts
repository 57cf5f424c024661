/** gRPC's length-prefixed messages read off chunks as they arrive (src/grpc/frames.ts). */
import { describe, expect, it } from "vitest";
import { Code, type ConnectError } from "@connectrpc/connect";
import { FrameReader } from "../src/grpc/frames.js";

const frame = (body: string, flag = 0) => {
  const b = Buffer.from(body);
  const out = Buffer.alloc(5 + b.length);
  out[0] = flag;
  out.writeUInt32BE(b.length, 1);
  b.copy(out, 5);
  return out;
};
const text = (ms: Uint8Array[]) => ms.map((m) => Buffer.from(m).toString());

describe("FrameReader", () => {
  it("gives each message once it is whole, across chunk boundaries anywhere (the header too), and several from one chunk", () => {
    const all = Buffer.concat([frame("one"), frame(""), frame("three"), frame("four")]);
    for (let cut = 1; cut < all.length; cut++) {
      const r = new FrameReader(100, "compressed");
      const got = [...text(r.push(all.subarray(0, cut))), ...text(r.push(all.subarray(cut)))];
      expect(got, `cut at ${cut}`).toEqual(["one", "", "three", "four"]);
      expect(r.partial).toBe(false);
    }
    const r = new FrameReader(100, "compressed");
    expect(text(r.push(frame("half").subarray(0, 7)))).toEqual([]);
    expect(r.partial).toBe(true);
  });

  it("refuses a compressed message (INTERNAL, with the reader's words) and one past its limit (RESOURCE_EXHAUSTED)", () => {
    const compressed = (() => {
      try {
        new FrameReader(100, "no compression was asked for").push(frame("x", 1));
      } catch (e) {
        return e as ConnectError;
      }
    })();
    expect(compressed).toMatchObject({ code: Code.Internal, rawMessage: "no compression was asked for" });
    expect(() => new FrameReader(3, "c").push(frame("four"))).toThrow(/message larger than 3 bytes/);
    try {
      new FrameReader(3, "c").push(frame("four"));
    } catch (e) {
      expect((e as ConnectError).code).toBe(Code.ResourceExhausted);
    }
  });
});
