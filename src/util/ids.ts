/**
 * ULIDs for rows this process creates in bulk. A monotonic factory draws randomness once per
 * millisecond and increments after that, so ids ascend in creation order also within one millisecond
 * (items of equal priority and createdon are dispatched by id: this keeps a priority first-in-first-
 * out), and a batch of ids costs almost nothing (a plain ulid() draws 16 random characters each).
 */
import { monotonicFactory } from "ulid";

export const newId = monotonicFactory();
