/**
 * Text that every gRPC peer can be sent. A lone surrogate (half of a UTF-16 pair, what cutting text
 * by index can leave, or what a JSON `\uD83D` escape makes) has no UTF-8 form and cannot be
 * percent-encoded into grpc-message: connect's encodeURIComponent throws on it.
 */
const LONE_SURROGATE = /[\uD800-\uDBFF](?![\uDC00-\uDFFF])|(?<![\uD800-\uDBFF])[\uDC00-\uDFFF]/g;
const HAS_LONE_SURROGATE = new RegExp(LONE_SURROGATE.source);

/** The text with each lone surrogate as U+FFFD, as a UTF-8 encoder writes it. */
export const wellFormed = (text: string): string => (HAS_LONE_SURROGATE.test(text) ? text.replace(LONE_SURROGATE, "\uFFFD") : text);

export const hasLoneSurrogate = (text: string): boolean => HAS_LONE_SURROGATE.test(text);
