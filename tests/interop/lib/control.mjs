// The line-oriented JSON control channel on stdin/stdout, and the plumbing that keeps stdout
// clean for it.
//
// stdout carries ONLY control lines: first `{"event":"listening",...}`, then one reply per command
// (`{"id":..,"ok":..}`). The library logs with console.log at a high rate (per stream frame), so
// `redirectConsole` sends every console method to stderr, to a file, or nowhere.

import { createWriteStream } from 'node:fs';
import { createInterface } from 'node:readline';
import { format } from 'node:util';

export function redirectConsole({ quiet = false, logFile = null } = {}) {
  let write;
  if (quiet) {
    write = () => {};
  } else if (logFile) {
    const out = createWriteStream(logFile, { flags: 'a' });
    write = (line) => out.write(line);
  } else {
    write = (line) => process.stderr.write(line);
  }
  const log = (...args) => write(`${format(...args)}\n`);
  for (const name of ['log', 'info', 'warn', 'error', 'debug', 'trace']) console[name] = log;
  return log;
}

export function emit(obj) {
  process.stdout.write(`${JSON.stringify(obj)}\n`);
}

/**
 * Reads commands from stdin, one JSON object a line, and answers each with
 * `{"id": <its id>, ...result}`. Commands run concurrently: a slow `fire` does not block `events`.
 * `commands[cmd](msg)` returns the result object (`ok` defaults to true); a thrown error becomes
 * `{"ok":false,"exception":message}`. `onEnd` runs when stdin closes.
 */
export function serveControl(commands, { onEnd }) {
  const rl = createInterface({ input: process.stdin, crlfDelay: Infinity });
  rl.on('line', (line) => {
    if (!line.trim()) return;
    let msg;
    try {
      msg = JSON.parse(line);
    } catch (err) {
      emit({ id: null, ok: false, exception: `control line is not JSON: ${err.message}` });
      return;
    }
    const id = msg?.id ?? null;
    const handler = commands[msg?.cmd];
    if (!handler) {
      emit({ id, ok: false, exception: `unknown command ${JSON.stringify(msg?.cmd)}` });
      return;
    }
    Promise.resolve()
      .then(() => handler(msg))
      .then(
        (result) => emit({ id, ok: true, ...result }),
        (err) => emit({ id, ok: false, exception: String(err?.message ?? err) }),
      );
  });
  rl.on('close', onEnd);
}

/** Condition waiters: `waitFor(pred, timeoutMs)` resolves when `pred()` holds after a `notify()`. */
export class Waiters {
  constructor() {
    this.waiting = new Set();
  }

  notify() {
    for (const w of [...this.waiting]) {
      if (w.pred()) {
        this.waiting.delete(w);
        clearTimeout(w.timer);
        w.resolve(true);
      }
    }
  }

  waitFor(pred, timeoutMs) {
    if (pred()) return Promise.resolve(true);
    return new Promise((resolve) => {
      const w = { pred, resolve };
      w.timer = setTimeout(() => {
        this.waiting.delete(w);
        resolve(false);
      }, timeoutMs);
      this.waiting.add(w);
    });
  }
}

/** Races `promise` against a timer; resolves to `onTimeout()` when the timer wins. */
export function withTimeout(promise, timeoutMs, onTimeout) {
  let timer;
  const timeout = new Promise((resolve) => {
    timer = setTimeout(() => resolve(onTimeout()), timeoutMs);
  });
  return Promise.race([promise, timeout]).finally(() => clearTimeout(timer));
}
