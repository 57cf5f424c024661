/**
 * grpc-message's encoding (src/grpc/message.ts) against what each kind of client does with it:
 * grpc-js decodes with decodeURI, connect-es with decodeURIComponent, the SDK with decodeGrpcMessage.
 */
import { Code, ConnectError } from "@connectrpc/connect";
import { describe, expect, it } from "vitest";
import { decodeGrpcMessage, encodeGrpcMessage, respecGrpcMessage, setGrpcStatus } from "../src/grpc/message.js";

const TEXTS = [
  "plain words",
  "node 'a': is on a cycle: a -> c",
  "a:b/c?d#e@f&g=h+i$j,k;l",
  "100% done, %41 is not an escape",
  "é, ü, 日本, 🚀",
  "two\nlines\tand a tab\r",
  " spaces at both ends ",
  "",
];

describe("encodeGrpcMessage", () => {
  it("encodes only bytes outside 0x20-0x7E, '%', and a space at either end", () => {
    expect(encodeGrpcMessage("node 'a': is on a cycle: a -> c")).toBe("node 'a': is on a cycle: a -> c");
    expect(encodeGrpcMessage("100% é\n")).toBe("100%25 %C3%A9%0A");
    expect(encodeGrpcMessage(" x y ")).toBe("%20x y%20");
    expect(encodeGrpcMessage("\x7f~")).toBe("%7F~");
  });

  it("is read back as written by decodeURI (grpc-js), decodeURIComponent (connect-es) and decodeGrpcMessage", () => {
    for (const text of TEXTS) {
      const sent = encodeGrpcMessage(text);
      expect(sent).toMatch(/^[\x21-\x7e]([\x20-\x7e]*[\x21-\x7e])?$|^$/);
      expect([decodeURI(sent), decodeURIComponent(sent), decodeGrpcMessage(sent)]).toEqual([text, text, text]);
    }
  });

  it("writes a lone surrogate as U+FFFD instead of throwing", () => {
    expect(decodeGrpcMessage(encodeGrpcMessage("half \ud83d"))).toBe("half \ufffd");
  });
});

describe("decodeGrpcMessage", () => {
  it("keeps a '%' that starts no escape and turns bytes that are not UTF-8 into U+FFFD, without throwing", () => {
    expect(decodeGrpcMessage("no agent, 100%")).toBe("no agent, 100%");
    expect(decodeGrpcMessage("%C3%A9 at 100%")).toBe("é at 100%");
    expect(decodeGrpcMessage("%zz%4")).toBe("%zz%4");
    expect(decodeGrpcMessage("bad %FF byte")).toBe("bad \ufffd byte");
  });
});

describe("setGrpcStatus and respecGrpcMessage", () => {
  it("set the spec's encoding, keep connect's status, metadata and details", () => {
    const err = new ConnectError("key: 100% é", Code.NotFound, { "x-why": "test" });
    const h = setGrpcStatus(new Headers(), err);
    expect([h.get("grpc-status"), h.get("grpc-message"), h.get("x-why")]).toEqual(["5", "key: 100%25 %C3%A9", "test"]);
    expect(setGrpcStatus(new Headers(), undefined).get("grpc-status")).toBe("0");
  });

  it("rewrite connect's encodeURIComponent, and leave the spec's encoding as it is", () => {
    const text = "node 'a': 100% é\n";
    const connect = new Headers({ "grpc-message": encodeURIComponent(text) });
    expect(respecGrpcMessage(connect).get("grpc-message")).toBe(encodeGrpcMessage(text));
    expect(respecGrpcMessage(connect).get("grpc-message")).toBe(encodeGrpcMessage(text));
  });
});
