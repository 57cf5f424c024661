export { compileCodec, type Codec } from "./compile.js";
