export { compileCodec, type Codec } from "./compile.js";
export { nodeHeaders, webHeaders } from "./http2-headers.js";
