/** Agent versions for the drain selector (src/util/semver.ts): what reads as a version, and its order. */
import { describe, expect, it } from "vitest";
import { compareVersions, parseVersion } from "../src/util/semver.js";

const cmp = (a: string, b: string) => Math.sign(compareVersions(parseVersion(a)!, parseVersion(b)!));

describe("parseVersion", () => {
  it("reads MAJOR[.MINOR[.PATCH]] with an optional v, -prerelease and +build", () => {
    expect(parseVersion("1.10.0")).toEqual({ parts: [1, 10, 0], pre: [] });
    expect(parseVersion("v2")).toEqual({ parts: [2, 0, 0], pre: [] });
    expect(parseVersion(" 1.4 ")).toEqual({ parts: [1, 4, 0], pre: [] });
    expect(parseVersion("2.0.0-rc.1+build.7")).toEqual({ parts: [2, 0, 0], pre: ["rc", "1"] });
  });

  it("answers null for what is not a version, rather than guessing", () => {
    for (const text of ["sim-1.1.0", "example-1.0.0", "latest", "", "1.x", "1.2.3.4", "01.2.3", "1..2", "1.2.3-", "1.2.3+", "v", "99999999999999999999.0.0"])
      expect(parseVersion(text), text).toBeNull();
  });
});

describe("compareVersions", () => {
  it("orders numerically part by part; missing parts are 0", () => {
    expect(cmp("1.9.2", "1.10.0")).toBe(-1);
    expect(cmp("1.10", "1.10.0")).toBe(0);
    expect(cmp("v1.10.0", "1.10.0")).toBe(0);
    expect(cmp("2.0.0", "1.99.99")).toBe(1);
  });

  it("puts a prerelease before its release and orders prereleases as semver does; build metadata does not count", () => {
    expect(cmp("2.0.0-rc.1", "2.0.0")).toBe(-1);
    expect(cmp("2.0.0-rc.1", "1.9.9")).toBe(1);
    const order = ["1.0.0-alpha", "1.0.0-alpha.1", "1.0.0-alpha.beta", "1.0.0-beta", "1.0.0-beta.2", "1.0.0-beta.11", "1.0.0-rc.1", "1.0.0"];
    for (let i = 1; i < order.length; i++) expect(cmp(order[i - 1]!, order[i]!), `${order[i - 1]} < ${order[i]}`).toBe(-1);
    expect(cmp("1.0.0+a", "1.0.0+b")).toBe(0);
  });
});
