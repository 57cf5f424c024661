/** A progress bar on a terminal; plain periodic lines when output is not a terminal. */
export class Bar {
  #lastPlain = 0;
  readonly #tty = process.stderr.isTTY === true;
  readonly #start = Date.now();

  constructor(private readonly total: number) {}

  update(done: number, note: string): void {
    const pct = Math.min(1, done / this.total);
    const rate = done / Math.max(0.001, (Date.now() - this.#start) / 1000);
    if (this.#tty) {
      const width = 30;
      const filled = Math.round(pct * width);
      process.stderr.write(
        `\r\u001b[2K[${"#".repeat(filled)}${"-".repeat(width - filled)}] ${(pct * 100).toFixed(0).padStart(3)}% ${done}/${this.total} ${rate.toFixed(0)}/s ${note}`,
      );
    } else if (Date.now() - this.#lastPlain >= 1000 || done >= this.total) {
      this.#lastPlain = Date.now();
      process.stderr.write(`progress ${done}/${this.total} (${(pct * 100).toFixed(0)}%) ${rate.toFixed(0)}/s ${note}\n`);
    }
  }

  log(line: string): void {
    process.stderr.write(this.#tty ? `\r\u001b[2K${line}\n` : `${line}\n`);
  }

  done(): void {
    if (this.#tty) process.stderr.write("\n");
  }
}
