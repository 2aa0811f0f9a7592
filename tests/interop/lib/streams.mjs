// VirtualStream helpers shared by the stand-in Cloudly and the benchmark responder:
// deterministic test bytes, draining a received stream into sha256 + length, and feeding bytes
// into a stream we initiate.
//
// Deterministic bytes: the first N bytes of SHAKE256(utf8(String(seed))), an extendable-output
// hash, so Python reproduces them with `hashlib.shake_256(str(seed).encode()).digest(n)`.
// Shorter outputs are prefixes of longer ones. 64 MiB takes ~0.25 s in Node and ~0.2 s in Python.

import { createHash } from 'node:crypto';
import { VirtualStream } from '@api.global/typedrequest';
import { CLOSING_BIT } from './wsglue.mjs';

export const MAX_GENERATED_BYTES = 1024 * 1024 * 1024;

export function deterministicBytes(seed, n) {
  if (!Number.isSafeInteger(n) || n < 0 || n > MAX_GENERATED_BYTES) {
    throw new Error(`bytes must be an integer in [0, ${MAX_GENERATED_BYTES}]`);
  }
  if (typeof seed !== 'string' && !Number.isSafeInteger(seed)) {
    throw new Error('seed must be a string or a safe integer');
  }
  if (n === 0) return Buffer.alloc(0);
  return createHash('shake256', { outputLength: n }).update(String(seed), 'utf8').digest();
}

export function sha256Hex(buf) {
  return createHash('sha256').update(buf).digest('hex');
}

/** The VirtualStream instances among the top-level fields of a decoded request. */
export function streamFields(request) {
  const found = [];
  for (const [field, value] of Object.entries(request ?? {})) {
    if (value instanceof VirtualStream) found.push({ field, stream: value });
  }
  return found;
}

/**
 * Drains a responder-side VirtualStream until the closing bit (status 'complete') or until
 * `closedPromise` settles first (status 'broken'). `record` is updated in place as bytes arrive.
 * `readDelayMs` makes a slow reader (a pause before each chunk is taken); `readPauseMs` one
 * that stops reading that long once it took `readPauseAfter` chunks. `record.maxQueued` is the
 * most chunks the library's receive queue held when one was taken or a 5 ms sample looked.
 * With `keep`, the bytes themselves are returned too (`{record, data}`, data null unless the
 * stream completed); otherwise only `record`.
 */
export async function drainStream(
  stream,
  record,
  closedPromise,
  { readDelayMs = 0, readPauseMs = 0, readPauseAfter = 0, keep = false } = {},
) {
  const kept = [];
  const hash = createHash('sha256');
  const BROKEN = Symbol('broken');
  const closed = closedPromise.then(() => BROKEN);
  record.status = 'open';
  record.bytes = 0;
  record.chunks = 0;
  record.maxQueued = 0;
  const queued = () => stream.receiveBackpressuredArray?.data?.length ?? 0;
  const sample = () => { record.maxQueued = Math.max(record.maxQueued, queued()); };
  const sampler = setInterval(sample, 5);
  const started = process.hrtime.bigint();
  for (;;) {
    if (readDelayMs > 0) await new Promise((resolve) => setTimeout(resolve, readDelayMs));
    if (readPauseMs > 0 && record.chunks === readPauseAfter) {
      await new Promise((resolve) => setTimeout(resolve, readPauseMs));
    }
    sample();
    const value = await Promise.race([stream.fetchData(), closed]);
    if (value === BROKEN) {
      record.status = 'broken';
      break;
    }
    if (value === CLOSING_BIT) {
      record.status = 'complete';
      break;
    }
    if (!(value instanceof Uint8Array)) {
      // the library passes through anything it could not rebuild into bytes
      record.status = 'bad-chunk';
      record.badChunkType = typeof value;
      break;
    }
    hash.update(value);
    if (keep) kept.push(Buffer.from(value));
    record.bytes += value.length;
    record.chunks += 1;
  }
  clearInterval(sampler);
  record.sha256 = hash.digest('hex');
  record.seconds = Number(process.hrtime.bigint() - started) / 1e9;
  if (!keep) return record;
  return { record, data: record.status === 'complete' ? Buffer.concat(kept) : null };
}

/**
 * Feeds `data` into an initiator-side VirtualStream in `chunkSize` pieces, then sends the
 * closing bit. `encoding` picks the JSON form of each chunk: 'buffer' (a Node Buffer, which
 * JSON.stringify writes as {"type":"Buffer","data":[..]}) or 'uint8array' ({"0":..,"1":..}).
 * Stops early (without the closing bit) when `shouldStop()` turns true.
 */
export async function feedStream(stream, data, { chunkSize, encoding = 'buffer', shouldStop = () => false }) {
  if (!Number.isSafeInteger(chunkSize) || chunkSize <= 0) throw new Error('chunkSize must be a positive integer');
  if (encoding !== 'buffer' && encoding !== 'uint8array') throw new Error("encoding must be 'buffer' or 'uint8array'");
  let chunks = 0;
  for (let offset = 0; offset < data.length; offset += chunkSize) {
    if (shouldStop()) return { chunks, closed: false };
    const slice = data.subarray(offset, Math.min(offset + chunkSize, data.length));
    await stream.sendData(encoding === 'buffer' ? Buffer.from(slice) : new Uint8Array(slice));
    chunks += 1;
  }
  if (shouldStop()) return { chunks, closed: false };
  await stream.close(true);
  return { chunks, closed: true };
}
