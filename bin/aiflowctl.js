#!/usr/bin/env node
// The operators' CLI, compiled (dist/ is made by `npm run build`).
import { runCompiled } from "./compiled.js";

await runCompiled("cli/aiflowctl-main.js");
