// Declarations of build-stamp.mjs, for the test setup that imports it.
export declare const DAEMON_INPUTS: readonly string[];
export declare function fingerprint(root: string, inputs?: readonly string[]): string;
export declare function clearStamp(out: string): void;
export declare function writeStamp(out: string, print: string): void;
export declare function isCurrent(root: string, out: string): boolean;
