#!/usr/bin/env node
// The daemon, compiled (dist/ is made by `npm run build`; the image and CI build it).
import { runCompiled } from "./compiled.js";

await runCompiled("cli/aiflowd.js");
