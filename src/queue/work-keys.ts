/** The keys claims wait on and rings wake (./wakeups.ts): one per tenant × engine kind. */

/** Wakeups key for claimable work of one tenant and engine kind. */
export const workKey = (tenant: string, kind: string) => `${tenant}\u0000${kind}`;

/** The tenant and engine kind of a workKey. */
export const keyParts = (key: string) => {
  const i = key.indexOf("\u0000");
  return { tenant: key.slice(0, i), kind: key.slice(i + 1) };
};
