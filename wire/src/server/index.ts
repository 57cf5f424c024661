export { grpcUnaryFastPath, type ErrorLog, type GrpcUnaryOptions } from "./unary-fast-path.js";
export { connectHandler, type ConnectHandlerOptions, type NodeConnectHandler } from "./connect-handler.js";
export { recordUnary, routeStreams, type BidiSpec, type RecordedStreams, type UnarySpec } from "./routes.js";
export { grpcBidiFastPath } from "./bidi-fast-path.js";
export type { BodyBudget } from "./request-body.js";
