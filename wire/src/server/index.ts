export { grpcUnaryFastPath, type ErrorLog, type GrpcUnaryOptions } from "./unary-fast-path.js";
export { recordUnary, routeStreams, type UnarySpec } from "./routes.js";
export type { BodyBudget } from "./request-body.js";
