// Transport glue between one `ws` WebSocket and the REAL @api.global/typedrequest 3.3.0.
//
// typedrequest 3.3.0 ships no websocket transport (that lives in @api.global/typedsocket, which
// the registry here does not carry). This module is the minimum a G2 (SmartServe-style) peer
// needs, written so that every frame the library builds goes out unchanged:
//
//   * one JSON envelope per text frame, `JSON.stringify` out, `JSON.parse` in (binary frames are
//     decoded as UTF-8 JSON too, as SmartServe does);
//   * incoming `phase:"request"` frames and incoming `##VirtualStream##` frames that are not
//     replies to us go through `TypedRouter.routeAndAddResponse`; a non-null result is sent back;
//   * calls WE fire use `TypedRequest` over a `TypedTarget({postMethod})` whose postMethod sends
//     the frame and resolves with the matching reply. Replies are matched by `correlation.id`;
//     `##VirtualStream##` frames carry no correlation, so their replies are matched by
//     `cycleId` (`response.cycleId`, or `request.cycleId` when the peer echoed the frame with
//     `response:null`, which is what the library does for an unknown streamId).
//     The library's own `typedRouterRef` mode cannot be used: `TypedTarget.post` would read
//     `payload.correlation.id` of stream frames and throw (they have no correlation).
//   * when the socket closes, every pending call is rejected (the library has no timeouts, so
//     without this a lost reply would hang the caller forever).
//   * `rawHandlers[method](frame)` may answer a request frame before the router sees it: that is
//     how envelope-level replies the TypedHandler API cannot produce (e.g. `retry`) are sent.
//     `streamHandler(frame)` does the same for `##VirtualStream##` frames (a stream served
//     outside the library, which 3.3.0 cannot do for a stream in a response).
//
// Frames are processed concurrently, one async task per frame, like SmartServe does.

import { TypedRequest, TypedRouter, TypedTarget } from '@api.global/typedrequest';

// Re-exported so scripts outside tests/interop (bench/) use the very same module instance.
export { TypedHandler, TypedResponseError, VirtualStream } from '@api.global/typedrequest';
export { WebSocketServer } from 'ws';

export const CLOSING_BIT = '#############CLOSING BIT#############';
export const STREAM_METHOD = '##VirtualStream##';

export class ConnectionClosedError extends Error {
  constructor() {
    super('connection closed before the reply arrived');
    this.name = 'ConnectionClosedError';
  }
}

/**
 * Classifies the JSON form of a chunk: for a parsed incoming frame, the form on the wire; for an
 * outgoing value, the form JSON.stringify will give it (Buffer -> 'buffer', Uint8Array -> 'indexed').
 */
export function chunkForm(chunkData) {
  if (chunkData === CLOSING_BIT) return 'closing-bit';
  if (Buffer.isBuffer(chunkData)) return 'buffer';
  if (chunkData instanceof Uint8Array) return 'indexed';
  if (typeof chunkData === 'string') return 'string';
  if (chunkData === null || typeof chunkData !== 'object') return typeof chunkData;
  if (chunkData.type === 'Buffer' && Array.isArray(chunkData.data)) return 'buffer';
  if (chunkData.type === 'EncodedBuffer') return 'encoded-buffer';
  const keys = Object.keys(chunkData);
  if (keys.length > 0 && /^\d+$/.test(keys[0])) return 'indexed';
  return 'object';
}

function chunkLength(chunkData) {
  if (chunkData instanceof Uint8Array) return chunkData.length;
  if (chunkData && typeof chunkData === 'object') {
    if (Array.isArray(chunkData.data)) return chunkData.data.length;
    return Object.keys(chunkData).length;
  }
  return typeof chunkData === 'string' ? chunkData.length : 0;
}

/** A copy of a frame that is safe to log: chunk payloads are replaced by their form and size. */
export function summarizeFrame(frame) {
  if (!frame || typeof frame !== 'object' || frame.method !== STREAM_METHOD) return frame;
  const abbreviate = (pkg) => {
    if (!pkg || typeof pkg !== 'object' || !('chunkData' in pkg)) return pkg;
    const form = chunkForm(pkg.chunkData);
    if (form === 'closing-bit') return pkg;
    return { ...pkg, chunkData: { _abbreviated: form, length: chunkLength(pkg.chunkData) } };
  };
  return { ...frame, request: abbreviate(frame.request), response: abbreviate(frame.response) };
}

export class SocketPeer {
  /**
   * @param {import('ws').WebSocket} ws
   * @param {object} opts
   * @param {number} opts.id            connection id (for logs and events)
   * @param {(router: TypedRouter, peer: SocketPeer) => void} [opts.install]  registers handlers
   * @param {Record<string, (frame: object, peer: SocketPeer) => object|null|Promise<object|null>>} [opts.rawHandlers]
   *        envelope-level answers keyed by method; returning null hands the frame to the router
   * @param {(dir: 'in'|'out', frame: object, peer: SocketPeer) => void} [opts.onFrame]  tracing hook
   * @param {(msg: string) => void} [opts.log]
   * @param {number} [opts.sendDelayMs]  every frame leaves this much later, in order (a far link)
   * @param {(frame: object, peer: SocketPeer) => object|null} [opts.streamHandler]
   *        answers a `##VirtualStream##` frame that is not a reply to us (a stream this side serves
   *        outside the library); returning null hands the frame to the router
   */
  constructor(ws, opts = {}) {
    this.ws = ws;
    this.id = opts.id ?? 0;
    this.router = new TypedRouter();
    this.target = new TypedTarget({ postMethod: (payload) => this.post(payload) });
    this.rawHandlers = opts.rawHandlers ?? {};
    this.streamHandler = opts.streamHandler ?? (() => null);
    this.onFrame = opts.onFrame ?? (() => {});
    this.sendDelayMs = opts.sendDelayMs ?? 0;
    this.log = opts.log ?? (() => {});
    this.pending = new Map(); // key -> {resolve, reject, frame}
    this.sendCounts = new Map(); // correlation id -> frames sent with it (retries reuse the id)
    this.lastSentCorrelationId = null;
    this.streamReplyHooks = []; // (sentFrame, reply) => void, for outgoing stream bookkeeping
    this.closed = false;
    this.closedPromise = new Promise((resolve) => {
      this._resolveClosed = resolve;
    });
    opts.install?.(this.router, this);
    ws.on('message', (data, isBinary) => {
      this.handleRaw(data, isBinary).catch((err) => this.log(`frame handling failed: ${err?.stack ?? err}`));
    });
    ws.on('close', () => this.markClosed());
    ws.on('error', (err) => this.log(`socket error on connection ${this.id}: ${err?.message ?? err}`));
  }

  markClosed() {
    if (this.closed) return;
    this.closed = true;
    const err = new ConnectionClosedError();
    for (const entry of this.pending.values()) entry.reject(err);
    this.pending.clear();
    this._resolveClosed();
  }

  send(frame) {
    if (this.closed || this.ws.readyState !== this.ws.OPEN) {
      throw new ConnectionClosedError();
    }
    this.onFrame('out', frame, this);
    const text = JSON.stringify(frame);
    if (this.sendDelayMs > 0) {
      // Timers of one delay fire in the order they were set: the frames keep their order.
      setTimeout(() => {
        if (!this.closed && this.ws.readyState === this.ws.OPEN) this.ws.send(text);
      }, this.sendDelayMs);
      return;
    }
    this.ws.send(text);
  }

  /** The TypedTarget postMethod: send one frame, resolve with its reply frame. */
  post(frame) {
    const key = replyKeyOfSent(frame);
    if (key === null) {
      return Promise.reject(new Error('frame has neither correlation.id nor request.cycleId'));
    }
    if (frame.correlation?.id) {
      this.lastSentCorrelationId = frame.correlation.id;
      this.sendCounts.set(frame.correlation.id, (this.sendCounts.get(frame.correlation.id) ?? 0) + 1);
    }
    return new Promise((resolve, reject) => {
      this.pending.set(key, { resolve, reject, frame });
      try {
        this.send(frame);
      } catch (err) {
        this.pending.delete(key);
        reject(err);
      }
    });
  }

  /**
   * Fires `method` at the remote peer through the library's TypedRequest. Returns
   * `{promise, correlationId}`: fire() sends its request frame synchronously (nothing in
   * TypedRequest.fire/postTrObject/TypedTarget.post awaits before the postMethod runs), so the
   * id can be read right after the call.
   */
  fire(method, request) {
    this.lastSentCorrelationId = null;
    const promise = new TypedRequest(this.target, method).fire(request);
    return { promise, correlationId: this.lastSentCorrelationId };
  }

  async handleRaw(data, isBinary) {
    let frame;
    try {
      frame = JSON.parse(Buffer.isBuffer(data) ? data.toString('utf8') : String(data));
    } catch (err) {
      this.log(`connection ${this.id}: dropped a frame that is not JSON (${err.message})`);
      return;
    }
    if (isBinary) this.log(`connection ${this.id}: got a binary frame; parsed it as UTF-8 JSON`);
    this.onFrame('in', frame, this);
    if (!frame || typeof frame !== 'object') return;

    // 1. replies to frames we sent
    const key = replyKeyOfReceived(frame);
    if (key !== null && this.pending.has(key)) {
      const entry = this.pending.get(key);
      this.pending.delete(key);
      if (frame.method === STREAM_METHOD) {
        for (const hook of this.streamReplyHooks) hook(entry.frame, frame);
      }
      entry.resolve(frame);
      return;
    }
    if (frame.method !== STREAM_METHOD && frame.correlation?.phase === 'response') {
      this.log(`connection ${this.id}: response for unknown correlation id ${frame.correlation?.id}`);
      return;
    }

    // 2. requests to us
    if (frame.method === STREAM_METHOD) {
      const reply = this.streamHandler(frame, this);
      if (reply) {
        this.sendQuietly(reply);
        return;
      }
    }
    const raw = frame.method !== STREAM_METHOD ? this.rawHandlers[frame.method] : undefined;
    if (raw) {
      const reply = await raw(frame, this);
      if (reply) {
        this.sendQuietly(reply);
        return;
      }
    }
    const reply = await this.router.routeAndAddResponse(frame);
    if (reply) this.sendQuietly(reply);
  }

  sendQuietly(frame) {
    try {
      this.send(frame);
    } catch (err) {
      this.log(`connection ${this.id}: reply not sent (${err.message})`);
    }
  }
}

function replyKeyOfSent(frame) {
  if (frame.method === STREAM_METHOD) {
    const cycleId = frame.request?.cycleId;
    return cycleId ? `s:${cycleId}` : null;
  }
  return frame.correlation?.id ? `r:${frame.correlation.id}` : null;
}

function replyKeyOfReceived(frame) {
  if (frame.method === STREAM_METHOD) {
    const cycleId = frame.response?.cycleId ?? frame.request?.cycleId;
    return cycleId ? `s:${cycleId}` : null;
  }
  if (frame.correlation?.phase === 'response' && frame.correlation.id) return `r:${frame.correlation.id}`;
  return null;
}
