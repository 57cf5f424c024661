export { compileCodec, type Codec } from "./compile.js";
export { codecFor } from "./any-message.js";
