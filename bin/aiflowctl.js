#!/usr/bin/env node
// Runs the TypeScript entry point through tsx's loader, so the CLI needs no build step.
import { register } from "tsx/esm/api";

register();
await import("../src/cli/aiflowctl-main.ts");
