/**
 * A job that runs when kicked, one run at a time: a kick while it runs makes it run once more when
 * it ends, however many kicks came meanwhile, so no kick is lost and none starts a second run beside
 * the first. What an engine's advance loop is: kicked by each notification, it works until nothing
 * is due.
 */
export class KickLoop {
  #kicked = false;
  #loop: Promise<void> | undefined;
  #stopped = false;

  constructor(
    private readonly job: () => Promise<unknown>,
    /** A run that threw; the loop goes on with the next kick. */
    private readonly onError: (err: unknown) => void,
  ) {}

  kick(): void {
    this.#kicked = true;
    this.#loop ??= (async () => {
      while (this.#kicked && !this.#stopped) {
        this.#kicked = false;
        try {
          await this.job();
        } catch (err) {
          this.onError(err);
        }
      }
      this.#loop = undefined;
    })();
  }

  /** Runs no more; resolves once a run under way has ended. */
  async stop(): Promise<void> {
    this.#stopped = true;
    await this.#loop;
  }
}
