#!/usr/bin/env node
// Stand-in Cloudly on the REAL @api.global/typedrequest 3.3.0, for interop tests.
//
//   node cloudly.mjs --token X [--cluster-id C] [--corestore-endpoint URL] [--port N] ...
//
// A `ws` WebSocketServer on 127.0.0.1 (any path is accepted, as SmartServe does); each connection
// gets its own TypedRouter (transport glue: lib/wsglue.mjs). stdout is a control channel: the first
// line is {"event":"listening","port":N,...}; then one JSON command per stdin line, one reply per
// stdout line. The methods served and the commands are listed in README.md.

import { createHmac, randomBytes } from 'node:crypto';
import { createWriteStream, readFileSync, renameSync, writeFileSync } from 'node:fs';
import { createServer } from 'node:http';
import { parseArgs } from 'node:util';
import { WebSocketServer } from 'ws';
import { TypedHandler, TypedResponseError, VirtualStream } from '@api.global/typedrequest';
import { CLOSING_BIT, STREAM_METHOD, SocketPeer, chunkForm, summarizeFrame } from './lib/wsglue.mjs';
import { deterministicBytes, drainStream, feedStream, sha256Hex, streamFields } from './lib/streams.mjs';
import { Waiters, emit, redirectConsole, serveControl, withTimeout } from './lib/control.mjs';

const { values: args } = parseArgs({
  options: {
    token: { type: 'string' },
    'cluster-id': { type: 'string', default: 'cluster-1' },
    'cluster-name': { type: 'string' },
    'node-id': { type: 'string', default: 'node-1' },
    'corestore-endpoint': { type: 'string', default: 'http://127.0.0.1:1' },
    'user-id': { type: 'string' },
    'jwt-ttl-ms': { type: 'string', default: '3600000' },
    host: { type: 'string', default: '127.0.0.1' },
    port: { type: 'string', default: '0' },
    deflate: { type: 'boolean', default: false },
    quiet: { type: 'boolean', default: false },
    'log-file': { type: 'string' },
    'trace-file': { type: 'string' },
    'frame-log': { type: 'string', default: '2000' },
    'closure-bytes': { type: 'string', default: '4096' },
    'send-delay-ms': { type: 'string', default: '0' },
    'synchronous-events': { type: 'string', default: 'true' },
    'serve-closures': { type: 'boolean', default: false },
  },
});
if (!args.token) {
  process.stderr.write('usage: node cloudly.mjs --token TOKEN [--cluster-id C] [--port N] ...\n');
  process.exit(2);
}
const log = redirectConsole({ quiet: args.quiet, logFile: args['log-file'] ?? null });
const clusterId = args['cluster-id'];
const userId = args['user-id'] ?? `${clusterId}-machine-user`;
const jwtTtlMs = Number(args['jwt-ttl-ms']);
const frameLogCap = Number(args['frame-log']);
const closureBytes = Number(args['closure-bytes']);
const trace = args['trace-file'] ? createWriteStream(args['trace-file'], { flags: 'a' }) : null;
if (!['true', 'false'].includes(args['synchronous-events'])) {
  process.stderr.write('--synchronous-events takes true or false\n');
  process.exit(2);
}
// ws's own option (8.x, default true): false makes it yield to the event loop after every
// message and control frame, so the code a message resolves runs before the next frame is read.
const allowSynchronousEvents = args['synchronous-events'] === 'true';
// Serve the closure stream of `restoreServiceDatabaseClosure` as a newer Cloudly would (answer
// the agent's `read`s); off, the 3.3.0 library answers it and cannot serve the stream.
let serveClosures = args['serve-closures'];
const SERVED_CHUNK_BYTES = 65536;

let clusterConfig = {
  configData: {
    id: clusterId,
    data: {
      name: args['cluster-name'] ?? clusterId,
      userId,
      nodes: [{ id: args['node-id'], data: { corestore: { endpoint: args['corestore-endpoint'] } } }],
    },
  },
  services: [],
};

// ---------------------------------------------------------------- recorded state

const waiters = new Waiters();
let state;
let frameSeq = 0;
function clearState() {
  state = {
    connections: [], // {id, remote, path, openedAt, closedAt, closeCode, tags}
    tags: [], // {conn, op, name, payload, at}
    identities: [], // {conn, name, userId, jwt, expiresAt, revoked, at}
    authFailures: [], // {conn, method, at}
    calls: [], // {conn, method, correlationId, request, at} for every incoming request frame
    streams: [], // received from the agent: {conn, method, field, streamId, status, bytes, sha256, ...}
    sentStreams: [], // fired at the agent with the `stream` command
    closureServes: [], // closure streams served outside the library: {conn, backupId, serviceId, streamId, source, bytes, status}
    unmatchedResponses: 0,
    frames: [], // ring of {seq, at, conn, dir, frame} with chunk payloads abbreviated
  };
}
clearState();
const streamFrameStats = new Map(); // streamId -> {purposes, forms, keepAliveFalse}
const retryState = new Map(); // retryOnce key -> {attempts, firstCorrelationId}
const overrides = new Map(); // method -> {response}|{errorText,errorData}|{plainError}, {times}
const peers = new Map(); // conn id -> SocketPeer (open ones)
// `${backupId}/${serviceId}` -> {descriptor, data}: every closure the agent backed up completely.
// Kept across `clear-events`: it is what a later restore serves.
const heldClosures = new Map();
const servedStreams = new Map(); // streamId -> {record, data, offset, closingSent}
let nextConnId = 1;

function statsFor(streamId) {
  if (!streamFrameStats.has(streamId)) {
    streamFrameStats.set(streamId, { purposes: {}, forms: {}, keepAliveFalse: false });
  }
  return streamFrameStats.get(streamId);
}

function onFrame(dir, frame, peer) {
  const seq = ++frameSeq;
  const at = Date.now();
  const summary = summarizeFrame(frame);
  state.frames.push({ seq, at, conn: peer.id, dir, frame: summary });
  if (state.frames.length > frameLogCap) state.frames.splice(0, state.frames.length - frameLogCap);
  trace?.write(`${JSON.stringify({ seq, at, conn: peer.id, dir, frame: summary })}\n`);
  if (dir !== 'in') return;
  if (frame?.method === STREAM_METHOD && frame.request?.streamId) {
    const s = statsFor(frame.request.streamId);
    const purpose = frame.request.mainPurpose;
    s.purposes[purpose] = (s.purposes[purpose] ?? 0) + 1;
    if ('chunkData' in frame.request) {
      const form = chunkForm(frame.request.chunkData);
      s.forms[form] = (s.forms[form] ?? 0) + 1;
    }
    if (frame.request.keepAlive === false) s.keepAliveFalse = true;
  } else if (frame?.correlation?.phase === 'request') {
    state.calls.push({ conn: peer.id, method: frame.method, correlationId: frame.correlation.id, request: frame.request, at });
    waiters.notify();
  } else if (frame?.correlation?.phase === 'response' && !peer.pending.has(`r:${frame.correlation.id}`)) {
    state.unmatchedResponses += 1;
  }
}

// ---------------------------------------------------------------- served methods

function base64url(obj) {
  return Buffer.from(JSON.stringify(obj)).toString('base64url');
}

function issueIdentity(conn) {
  const expiresAt = Date.now() + jwtTtlMs;
  const jwt = [
    base64url({ alg: 'RS256', typ: 'JWT' }),
    base64url({ sub: userId, clusterId, exp: Math.floor(expiresAt / 1000), nonce: randomBytes(8).toString('hex') }),
    randomBytes(32).toString('base64url'),
  ].join('.');
  const identity = { name: `${clusterId}-machine`, userId, type: 'machine', role: 'cluster', expiresAt, jwt };
  state.identities.push({ conn, ...identity, revoked: false, at: Date.now() });
  return identity;
}

function identityIsValid(identity) {
  const jwt = identity?.jwt;
  return state.identities.some((i) => i.jwt === jwt && !i.revoked && i.expiresAt > Date.now());
}

/** Applies a `handle` override for `method`, if one is set; returns undefined otherwise. */
function applyOverride(method) {
  const o = overrides.get(method);
  if (!o) return undefined;
  if (o.times !== undefined && --o.times <= 0) overrides.delete(method);
  if (o.errorText !== undefined) throw new TypedResponseError(o.errorText, o.errorData ?? {});
  if (o.plainError !== undefined) throw new Error(o.plainError);
  return o.response ?? {};
}

function receiveStreams(method, request, peer, meta = {}, options = {}) {
  const found = streamFields(request);
  if (found.length === 0) throw new TypedResponseError('no VirtualStream in request', { code: 'invalid-request' });
  return found.map(({ field, stream }) => {
    const record = { conn: peer.id, method, field, streamId: stream.streamId, status: 'open', bytes: 0, meta };
    state.streams.push(record);
    const done = drainStream(stream, record, peer.closedPromise, options).then((drained) => {
      if (options.keep && drained.data !== null) options.keep(drained.data);
      waiters.notify();
      return record;
    });
    return { record, done };
  });
}

function installHandlers(router, peer) {
  const serve = (method, fn) =>
    router.addTypedHandler(
      new TypedHandler(method, async (request, tools) => applyOverride(method) ?? fn(request ?? {}, tools)),
    );

  serve('getIdentityByToken', async ({ token }) => {
    if (token !== args.token) {
      state.authFailures.push({ conn: peer.id, method: 'getIdentityByToken', at: Date.now() });
      waiters.notify();
      throw new TypedResponseError('invalid token', {});
    }
    const identity = issueIdentity(peer.id);
    waiters.notify();
    return { identity };
  });
  serve('getClusterConfig', async ({ identity }) => {
    if (!identityIsValid(identity)) {
      state.authFailures.push({ conn: peer.id, method: 'getClusterConfig', at: Date.now() });
      waiters.notify();
      throw new TypedResponseError('identity is not valid', {});
    }
    return structuredClone(clusterConfig);
  });
  const tagOp = (op) => async ({ name, payload }) => {
    const conn = state.connections.find((c) => c.id === peer.id);
    if (op === 'set') conn.tags[name] = payload ?? null;
    else delete conn.tags[name];
    state.tags.push({ conn: peer.id, op, name, payload: payload ?? null, at: Date.now() });
    waiters.notify();
    return { success: true };
  };
  serve('__typedsocket_setTag', tagOp('set'));
  serve('__typedsocket_removeTag', tagOp('remove'));
  serve('echo', async (request) => request);
  serve('failWithError', async ({ text, data }) => {
    throw new TypedResponseError(text ?? 'requested failure', data ?? { code: 'test-failure' });
  });
  serve('throwPlainError', async () => {
    throw new Error('plain exception inside the handler');
  });
  serve('uploadStream', async (request) => {
    const reading = {
      readDelayMs: Number(request.readDelayMs ?? 0),
      readPauseMs: Number(request.readPauseMs ?? 0),
      readPauseAfter: Number(request.readPauseAfter ?? 0),
    };
    const [first] = receiveStreams('uploadStream', request, peer, {}, reading);
    if (request.replyWhen === 'start') return { accepted: true, streamId: first.record.streamId };
    const r = await first.done;
    const answer = { field: r.field, status: r.status, bytes: r.bytes, chunks: r.chunks, sha256: r.sha256 };
    const slowed = reading.readDelayMs > 0 || reading.readPauseMs > 0;
    return slowed ? { ...answer, maxQueued: r.maxQueued } : answer;
  });
  serve('backupServiceDatabaseClosure', async (request) => {
    const { backupId, serviceId, nodeId, descriptor } = request;
    // A complete closure is held under its backup: a later restore of it serves these bytes.
    const keep = (data) => heldClosures.set(`${backupId}/${serviceId}`, { descriptor, data, sha256: sha256Hex(data) });
    receiveStreams('backupServiceDatabaseClosure', request, peer, { backupId, serviceId, nodeId, descriptor }, { keep });
    return { accepted: true };
  });
  // Cloudly -> relay, closure serving off: the library answers the closure's descriptor
  // (`closureOf`) and a VirtualStream in the response. typedrequest 3.3.0 cannot serve that
  // stream (no `read`): the agent is expected to fail fast. With serving on, `rawHandlers`
  // answers first. Recorded in `calls` like every request.
  serve('restoreServiceDatabaseClosure', async ({ backupId, serviceId }) => {
    const { descriptor, data } = closureOf(backupId, serviceId);
    const closure = new VirtualStream();
    feedStream(closure, data, { chunkSize: 65536 }).catch(() => {});
    return { descriptor, closure };
  });
  // any method set with the `handle` command that has no built-in handler
  for (const method of overrides.keys()) addOverrideHandler(router, method);
}

// The closure a restore of (backupId, serviceId) gets: the one the agent backed up, if the
// stand-in holds it; else the first `closureBytes` deterministic bytes of seed
// `${backupId}/${serviceId}` with the receipt the reference Corestore issues for them.
function closureOf(backupId, serviceId) {
  const held = heldClosures.get(`${backupId}/${serviceId}`);
  if (held) return { ...held, source: 'backup' };
  const data = deterministicBytes(`${backupId}/${serviceId}`, closureBytes);
  const sha256 = sha256Hex(data);
  const mac = createHmac('sha256', 'reference-corestore-receipt-key')
    .update(`${serviceId}\n${backupId}\n${data.length}\n${sha256}`)
    .digest('hex');
  return { descriptor: { size: data.length, sha256, receipt: { issuer: 'reference-corestore', mac } }, data, source: 'generated' };
}

let nextServedStream = 1;

// `restoreServiceDatabaseClosure` while closures are served: answered outside the library with
// the descriptor and a stream marker, in the envelope the library would build; the stream's
// frames go to `serveStreamFrame`. Off (or with a `handle` override), the library answers.
function serveClosureRequest(frame, peer) {
  if (!serveClosures || overrides.has(frame.method)) return null;
  const { backupId, serviceId } = frame.request ?? {};
  const { descriptor, data, source } = closureOf(backupId, serviceId);
  const streamId = `cloudly_closure_${nextServedStream++}`;
  const record = { conn: peer.id, backupId, serviceId, streamId, source, bytes: data.length, status: 'serving' };
  state.closureServes.push(record);
  servedStreams.set(streamId, { record, data, offset: 0, closingSent: false });
  peer.closedPromise.then(() => {
    servedStreams.delete(streamId);
    if (record.status === 'serving') record.status = 'broken';
    waiters.notify();
  });
  waiters.notify();
  return {
    method: frame.method,
    request: frame.request,
    response: { descriptor, closure: { _isVirtualStream: true, streamId } },
    correlation: { id: frame.correlation?.id, phase: 'response' },
    localData: null,
  };
}

// The responder side of a served closure stream: each `read` gets the next chunk (`chunkData`
// as a Buffer, `next` while anything follows), then the closing bit; keep-alives are answered
// `keepAlive:true` until the reader's own `keepAlive:false`. Frames of other streams: null.
function serveStreamFrame(frame) {
  const pkg = frame.request;
  const served = pkg?.cycle === 'request' ? servedStreams.get(pkg.streamId) : undefined;
  if (!served) return null;
  const answer = (fields) => ({
    method: STREAM_METHOD,
    request: pkg,
    response: { streamId: pkg.streamId, cycleId: pkg.cycleId, cycle: 'response', ...fields },
    localData: null,
  });
  if (pkg.mainPurpose === 'read' && !served.closingSent) {
    let chunkData;
    if (served.offset < served.data.length) {
      const end = Math.min(served.offset + SERVED_CHUNK_BYTES, served.data.length);
      chunkData = served.data.subarray(served.offset, end);
      served.offset = end;
    } else {
      chunkData = CLOSING_BIT;
      served.closingSent = true;
      served.record.status = 'served';
      waiters.notify();
    }
    return answer({ mainPurpose: 'chunk', next: !served.closingSent, backpressure: false, chunkData });
  }
  if (pkg.mainPurpose === 'keepAlive') {
    if (pkg.keepAlive === false) servedStreams.delete(pkg.streamId);
    return answer({ mainPurpose: 'keepAlive', keepAlive: pkg.keepAlive !== false, next: !served.closingSent, backpressure: false });
  }
  return answer({ mainPurpose: 'feedback', next: !served.closingSent, backpressure: false });
}

function addOverrideHandler(router, method) {
  if (router.checkForTypedHandler(method)) return;
  router.addTypedHandler(
    new TypedHandler(method, async () => {
      const reply = applyOverride(method);
      if (reply === undefined) throw new TypedResponseError('There is no available method for this call on the server side', {});
      return reply;
    }),
  );
}

// `retryOnce` needs an envelope field (`retry`) that a TypedHandler cannot set, so it is answered
// at the transport: attempt 1 for a key gets {response:null, retry:{waitForMs, reason}}, later
// attempts get {response:{attempts, key, sameCorrelationId}}. key = request.key ?? correlation.id.
const rawHandlers = {
  retryOnce(frame) {
    const req = frame.request ?? {};
    const key = req.key ?? frame.correlation?.id;
    const reply = { method: frame.method, request: frame.request, response: null, correlation: { id: frame.correlation?.id, phase: 'response' } };
    const seen = retryState.get(key);
    if (!seen) {
      retryState.set(key, { attempts: 1, firstCorrelationId: frame.correlation?.id });
      return { ...reply, retry: { waitForMs: req.waitForMs ?? 50, reason: 'stand-in Cloudly asks for exactly one retry' }, localData: null };
    }
    seen.attempts += 1;
    return { ...reply, response: { attempts: seen.attempts, key, sameCorrelationId: seen.firstCorrelationId === frame.correlation?.id }, localData: null };
  },
  restoreServiceDatabaseClosure: serveClosureRequest,
};

// ---------------------------------------------------------------- server

const wss = new WebSocketServer({ noServer: true, perMessageDeflate: args.deflate, allowSynchronousEvents });
let httpServer = null;
let boundPort = Number(args.port);

function onConnection(ws, req) {
  const id = nextConnId++;
  const conn = { id, remote: `${req.socket.remoteAddress}:${req.socket.remotePort}`, path: req.url, openedAt: Date.now(), closedAt: null, closeCode: null, tags: {} };
  state.connections.push(conn);
  const sendDelayMs = Number(args['send-delay-ms']);
  const peer = new SocketPeer(ws, { id, install: installHandlers, rawHandlers, streamHandler: serveStreamFrame, onFrame, log, sendDelayMs });
  peers.set(id, peer);
  ws.on('close', (code) => {
    conn.closedAt = Date.now();
    conn.closeCode = code;
    peers.delete(id);
    waiters.notify();
  });
  waiters.notify();
}

function startServer() {
  return new Promise((resolve, reject) => {
    const server = createServer((req, res) => {
      res.writeHead(426, { 'content-type': 'text/plain' });
      res.end('websocket only\n');
    });
    server.on('upgrade', (req, socket, head) => wss.handleUpgrade(req, socket, head, (ws) => onConnection(ws, req)));
    server.once('error', reject);
    server.listen(boundPort, args.host, () => {
      httpServer = server;
      boundPort = server.address().port;
      resolve(boundPort);
    });
  });
}

async function closeClients({ mode = 'close', code = 1001, reason = 'going away' } = {}) {
  const open = [...peers.values()];
  for (const peer of open) {
    if (mode === 'terminate') peer.ws.terminate();
    else peer.ws.close(code, reason);
  }
  await Promise.all(open.map((p) => p.closedPromise));
  return open.length;
}

async function stopServer(opts) {
  const closed = await closeClients(opts);
  if (httpServer) {
    const server = httpServer;
    httpServer = null;
    await new Promise((resolve) => {
      server.close(() => resolve());
      server.closeAllConnections();
    });
  }
  return closed;
}

// ---------------------------------------------------------------- control commands

function pickPeer({ conn, tag }) {
  const open = [...peers.values()].filter((p) => !p.closed);
  let candidates = open;
  if (conn !== undefined) candidates = open.filter((p) => p.id === conn);
  if (tag !== undefined) candidates = candidates.filter((p) => tag in (state.connections.find((c) => c.id === p.id)?.tags ?? {}));
  const peer = candidates.at(-1);
  if (!peer) throw new Error('no open agent connection matches');
  return peer;
}

function describeFailure(err) {
  if (err instanceof TypedResponseError) return { ok: false, errorText: err.errorText, errorData: err.errorData ?? null };
  return { ok: false, exception: String(err?.message ?? err) };
}

const TIMED_OUT = Symbol('timeout');

function requireMethod(msg) {
  if (typeof msg.method !== 'string' || !msg.method) throw new Error('"method" must be a non-empty string');
}

async function cmdFire(msg) {
  requireMethod(msg);
  const peer = pickPeer(msg);
  const { promise, correlationId } = peer.fire(msg.method, msg.request ?? {});
  const outcome = await withTimeout(
    promise.then((response) => ({ response }), (err) => ({ err })),
    msg.timeoutMs ?? 30000,
    () => TIMED_OUT,
  );
  // sends > 1 means the agent answered with `retry` and the library re-sent the same frame
  const info = { conn: peer.id, correlationId, sends: peer.sendCounts.get(correlationId) ?? 0 };
  if (outcome === TIMED_OUT) return { ok: false, timeout: true, ...info };
  if (outcome.err) return { ...describeFailure(outcome.err), ...info };
  return { response: outcome.response ?? null, ...info };
}

async function cmdStream(msg) {
  requireMethod(msg);
  const peer = pickPeer(msg);
  const field = msg.field ?? 'archive';
  const data = deterministicBytes(msg.seed ?? 0, msg.bytes ?? 0);
  const sha256 = sha256Hex(data);
  const stream = new VirtualStream();
  const record = { conn: peer.id, method: msg.method, field, streamId: stream.streamId, bytes: data.length, sha256, chunksAcked: 0, closingBitAcked: false, probes: 0, status: 'sending' };
  state.sentStreams.push(record);
  let resolveClosingAck;
  const closingAcked = new Promise((resolve) => {
    resolveClosingAck = resolve;
  });
  const hook = (sent, reply) => {
    if (sent.request?.streamId !== stream.streamId) return;
    if (sent.request.mainPurpose === 'feedback') record.probes += 1; // the library's probes
    if (sent.request.mainPurpose !== 'chunk') return;
    if (sent.request.chunkData === CLOSING_BIT) {
      record.closingBitAcked = reply.response != null;
      resolveClosingAck();
    } else if (reply.response != null) {
      record.chunksAcked += 1;
    }
  };
  peer.streamReplyHooks.push(hook);
  const started = process.hrtime.bigint();
  let failed = false;
  // fire() encodes the request (the stream becomes the initiator side) and sends it before the
  // first chunk is queued, so the agent sees the marker before any stream frame.
  const { promise, correlationId } = peer.fire(msg.method, { ...(msg.request ?? {}), [field]: stream });
  const call = promise.then(
    (response) => ({ response }),
    (err) => {
      failed = true;
      return { err };
    },
  );
  const feeding = feedStream(stream, data, {
    chunkSize: msg.chunkSize ?? 256 * 1024,
    encoding: msg.encoding ?? 'buffer',
    shouldStop: () => failed || peer.closed,
  });
  const both = (async () => {
    const outcome = await call;
    if (outcome.err) {
      await stream.close(false); // stops the keep-alive loop; queued chunks may still go out
      return outcome;
    }
    const fed = await feeding;
    if (fed.closed) await Promise.race([closingAcked, peer.closedPromise]);
    return outcome;
  })();
  const outcome = await withTimeout(both, msg.timeoutMs ?? 120000, () => TIMED_OUT);
  record.seconds = Number(process.hrtime.bigint() - started) / 1e9;
  peer.streamReplyHooks = peer.streamReplyHooks.filter((h) => h !== hook);
  const report = { conn: peer.id, correlationId, streamId: stream.streamId, bytes: data.length, sha256, chunksAcked: record.chunksAcked, closingBitAcked: record.closingBitAcked, probes: record.probes, seconds: record.seconds };
  if (outcome === TIMED_OUT) {
    record.status = 'timeout';
    return { ok: false, timeout: true, ...report };
  }
  if (outcome.err) {
    record.status = 'failed';
    return { ...describeFailure(outcome.err), ...report };
  }
  record.status = record.closingBitAcked ? 'delivered' : 'broken';
  return { ok: record.closingBitAcked, response: outcome.response ?? null, ...report };
}

/** Replaces the file at `path` with `bytes` deterministic bytes of `seed`, synchronously. */
function writeFileNow({ path, seed, bytes }) {
  const data = deterministicBytes(seed, bytes);
  const tmp = `${path}.cloudly-${process.pid}.tmp`;
  writeFileSync(tmp, data);
  renameSync(tmp, path); // one step, as a database replaces its file
  return sha256Hex(data);
}

function sha256OfFile(path) {
  try {
    return sha256Hex(readFileSync(path));
  } catch (err) {
    if (err?.code === 'ENOENT') return null;
    throw err;
  }
}

// Cloudly's code as it is written: the next call goes out in the very turn the previous one
// settled (inside its `.then`), before the event loop reads anything else. Each call may first
// switch closure serving and replace a file (the service writing its database), both
// synchronously in that same turn; `observe` is a file whose sha256 is read in the turn each
// call settles. The chain stops at a call that times out.
async function cmdFireChain(msg) {
  if (!Array.isArray(msg.calls) || msg.calls.length === 0) throw new Error('"calls" must be a non-empty array');
  for (const call of msg.calls) requireMethod(call);
  const timeoutMs = msg.timeoutMs ?? 30000;
  const results = [];
  await new Promise((resolve) => {
    const fireAt = (index) => {
      if (index >= msg.calls.length) {
        resolve();
        return;
      }
      const call = msg.calls[index];
      const result = { index };
      results.push(result);
      if (call.serveClosures !== undefined) serveClosures = Boolean(call.serveClosures);
      if (call.write) result.wrote = writeFileNow(call.write);
      let peer;
      try {
        peer = pickPeer(call);
      } catch (err) {
        Object.assign(result, describeFailure(err));
        resolve();
        return;
      }
      const { promise, correlationId } = peer.fire(call.method, call.request ?? {});
      Object.assign(result, { conn: peer.id, correlationId, sentAt: Date.now() });
      let settled = false;
      const timer = setTimeout(() => {
        settled = true;
        Object.assign(result, { ok: false, timeout: true });
        resolve();
      }, timeoutMs);
      const settle = (outcome) => {
        if (settled) return;
        settled = true;
        clearTimeout(timer);
        Object.assign(result, outcome, { settledAt: Date.now(), sends: peer.sendCounts.get(correlationId) ?? 0 });
        if (msg.observe) result.observed = sha256OfFile(msg.observe);
        fireAt(index + 1); // the same turn: nothing is read from the socket in between
      };
      promise.then(
        (response) => settle({ ok: true, response: response ?? null }),
        (err) => settle(describeFailure(err)),
      );
    };
    fireAt(0);
  });
  return { results };
}

function snapshotEvents() {
  const streams = state.streams.map((s) => ({ ...s, frames: streamFrameStats.get(s.streamId) ?? null }));
  const { frames, ...rest } = state;
  const held = [...heldClosures].map(([key, { descriptor, data, sha256 }]) => ({ key, descriptor, bytes: data.length, sha256 }));
  return {
    ...structuredClone({ ...rest, streams }),
    openConnections: [...peers.keys()],
    retries: Object.fromEntries(retryState),
    heldClosures: held,
    servingClosures: serveClosures,
  };
}

const counters = {
  connections: () => state.connections.length,
  'open-connections': () => peers.size,
  tags: () => state.tags.filter((t) => t.op === 'set').length,
  identities: () => state.identities.length,
  'auth-failures': () => state.authFailures.length,
  streams: () => state.streams.filter((s) => s.status !== 'open').length,
  'closure-serves': () => state.closureServes.filter((s) => s.status !== 'serving').length,
  calls: (msg) => state.calls.filter((c) => msg.method === undefined || c.method === msg.method).length,
};

const commands = {
  ping: async () => ({}),
  fire: cmdFire,
  stream: cmdStream,
  'fire-chain': cmdFireChain,
  'serve-closures': async (msg) => {
    serveClosures = Boolean(msg.on);
    return { serving: serveClosures };
  },
  events: async () => ({ events: snapshotEvents() }),
  frames: async (msg) => ({ frames: state.frames.filter((f) => f.seq > (msg.since ?? 0)), lastSeq: frameSeq }),
  wait: async (msg) => {
    const count = counters[msg.for];
    if (!count) throw new Error(`wait: unknown counter ${JSON.stringify(msg.for)} (one of ${Object.keys(counters).join(', ')})`);
    const target = msg.count ?? 1;
    const reached = await waiters.waitFor(() => count(msg) >= target, msg.timeoutMs ?? 10000);
    return { ok: reached, reached, value: count(msg), events: snapshotEvents() };
  },
  'close-clients': async (msg) => ({ closed: await closeClients(msg) }),
  stop: async (msg) => ({ closed: await stopServer(msg) }),
  start: async () => ({ port: httpServer ? boundPort : await startServer() }),
  restart: async (msg) => {
    const closed = await stopServer(msg);
    return { closed, port: await startServer() };
  },
  handle: async (msg) => {
    requireMethod(msg);
    if (msg.clear) {
      overrides.delete(msg.method);
      return {};
    }
    const { method, response, errorText, errorData, plainError, times } = msg;
    overrides.set(method, { response, errorText, errorData, plainError, times });
    for (const peer of peers.values()) addOverrideHandler(peer.router, method);
    return {};
  },
  'raw-send': async (msg) => {
    // one frame exactly as given, bypassing the library (e.g. a stray ##VirtualStream## frame)
    if (!msg.frame || typeof msg.frame !== 'object') throw new Error('"frame" must be an object');
    const peer = pickPeer(msg);
    peer.send(msg.frame);
    return { conn: peer.id };
  },
  'cluster-config': async () => ({ clusterConfig }),
  'set-cluster-config': async (msg) => {
    clusterConfig = { configData: msg.configData ?? clusterConfig.configData, services: msg.services ?? clusterConfig.services };
    return { clusterConfig };
  },
  'revoke-identities': async () => {
    for (const i of state.identities) i.revoked = true;
    return { revoked: state.identities.length };
  },
  'clear-events': async () => {
    clearState();
    streamFrameStats.clear();
    retryState.clear();
    return {};
  },
  shutdown: async () => {
    setImmediate(() => shutdown(0));
    return {};
  },
};

async function shutdown(code) {
  await stopServer({ mode: 'terminate' }).catch(() => {});
  trace?.end();
  process.exit(code);
}

process.on('SIGTERM', () => shutdown(0));
process.on('SIGINT', () => shutdown(0));

try {
  const port = await startServer();
  emit({ event: 'listening', port, host: args.host, url: `ws://${args.host}:${port}/` });
} catch (err) {
  emit({ event: 'error', message: String(err?.message ?? err) });
  process.exit(3);
}
serveControl(commands, { onEnd: () => shutdown(0) });
