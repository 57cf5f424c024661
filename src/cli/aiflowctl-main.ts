import { main } from "./aiflowctl.js";

process.exitCode = await main(process.argv.slice(2));
