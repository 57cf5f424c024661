/** What an identifier may be made of: agent names, tenant keys, engine kinds, tag keys, ids. */
const NAME = /^[A-Za-z0-9._:-]+$/;

/** Whether `v` is made only of identifier characters (the tokens file's agent patterns use it too). */
export const isIdentifierText = (v: string): boolean => NAME.test(v);

/** A tenant key as every edge takes one: 1-128 identifier characters. */
export const isTenantKey = (v: string): boolean => v.length > 0 && v.length <= 128 && NAME.test(v);

/** The longest key an item may carry (affinity, concurrency and rate limit keys), and so the longest an operator may name. */
export const MAX_KEY_CHARS = 512;
