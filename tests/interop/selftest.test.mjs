// Self-test of the stand-in Cloudly and the bench responder, with a raw `ws` client that speaks
// the wire by hand (as the Python agent does), so the frames checked here are the frames a
// Python peer sees. Run: `node --test` in tests/interop (after `npm ci`).

import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import { createHash } from 'node:crypto';
import { rmSync } from 'node:fs';
import { createInterface } from 'node:readline';
import { after, before, test } from 'node:test';
import { fileURLToPath } from 'node:url';
import { WebSocket } from 'ws';

const here = (p) => fileURLToPath(new URL(p, import.meta.url));
const CLOSING_BIT = '#############CLOSING BIT#############';
const shake = (seed, n) => createHash('shake256', { outputLength: n }).update(String(seed)).digest();
const sha = (b) => createHash('sha256').update(b).digest('hex');

/** Starts a script whose stdout is line JSON; returns {proc, first, next(), send(cmd)}. */
async function startScript(script, argv) {
  const proc = spawn(process.execPath, [script, ...argv], { stdio: ['pipe', 'pipe', 'ignore'] });
  const lines = createInterface({ input: proc.stdout })[Symbol.asyncIterator]();
  const next = async () => JSON.parse((await lines.next()).value);
  const first = await next();
  let id = 0;
  const waiting = new Map();
  const api = { proc, first, next };
  api.send = (cmd) => {
    const cid = ++id;
    proc.stdin.write(`${JSON.stringify({ id: cid, ...cmd })}\n`);
    return new Promise((resolve) => waiting.set(cid, resolve));
  };
  api.pump = async () => {
    for (;;) {
      const r = await lines.next();
      if (r.done) return;
      const msg = JSON.parse(r.value);
      waiting.get(msg.id)?.(msg);
      waiting.delete(msg.id);
    }
  };
  return api;
}

/** A hand-written agent: outgoing calls by correlation id, answers stream frames as a responder. */
class RawAgent {
  constructor(url) {
    this.ws = new WebSocket(url);
    this.pending = new Map();
    this.handlers = {};
    this.streams = new Map(); // streamId -> {chunks: Buffer[], forms, done}
    this.seen = [];
    this.seq = 0;
    this.ws.on('message', (data) => this.onMessage(JSON.parse(data.toString())));
    this.opened = new Promise((resolve, reject) => {
      this.ws.once('open', resolve);
      this.ws.once('error', reject);
    });
    this.closed = new Promise((resolve) => this.ws.once('close', resolve));
  }

  onMessage(f) {
    this.seen.push(f);
    if (f.method === '##VirtualStream##') {
      const key = f.response?.cycleId ?? f.request?.cycleId;
      if (this.pending.has(key) && f.response !== null) return this.settle(key, f);
      const req = f.request;
      const st = this.stream(req.streamId);
      const response = { streamId: req.streamId, cycleId: req.cycleId, cycle: 'response', mainPurpose: req.mainPurpose, next: false, backpressure: false };
      if (req.mainPurpose === 'keepAlive') response.keepAlive = true;
      let request = req;
      if (req.mainPurpose === 'chunk') {
        if (req.chunkData === CLOSING_BIT) st.done = true;
        else {
          st.forms.add(req.chunkData.type === 'Buffer' ? 'buffer' : 'other');
          st.chunks.push(Buffer.from(req.chunkData.data));
        }
        response.mainPurpose = 'feedback';
        request = null;
      }
      this.ws.send(JSON.stringify({ method: f.method, request, response, localData: null }));
      if (st.done) st.onDone?.();
      return undefined;
    }
    if (f.correlation?.phase === 'response') return this.settle(`r:${f.correlation.id}`, f);
    const handler = this.handlers[f.method];
    Promise.resolve(handler ? handler(f.request) : { error: { text: 'no handler', data: {} } }).then((out) => {
      const request = Object.fromEntries(
        Object.entries(f.request ?? {}).map(([k, v]) => [k, v?._isVirtualStream ? { _OBMITTED_VIRTUAL_STREAM: true, reason: 'echo' } : v]),
      );
      this.ws.send(JSON.stringify({ method: f.method, request, response: out.response ?? null, correlation: { id: f.correlation.id, phase: 'response' }, ...(out.error ? { error: out.error } : {}) }));
    });
    return undefined;
  }

  settle(key, f) {
    const resolve = this.pending.get(key);
    this.pending.delete(key);
    resolve(f);
  }

  send(frame, key) {
    return new Promise((resolve) => {
      this.pending.set(key, resolve);
      this.ws.send(JSON.stringify(frame));
    });
  }

  call(method, request, id = `py_${++this.seq}`) {
    return this.send({ method, request, response: null, correlation: { id, phase: 'request' } }, `r:${id}`);
  }

  streamFrame(streamId, mainPurpose, extra) {
    const cycleId = `cyc_${++this.seq}`;
    return this.send({ method: '##VirtualStream##', request: { streamId, cycleId, cycle: 'request', mainPurpose, ...extra }, response: null }, cycleId);
  }

  stream(streamId) {
    if (!this.streams.has(streamId)) this.streams.set(streamId, { chunks: [], forms: new Set(), done: false });
    return this.streams.get(streamId);
  }

  received(streamId) {
    const st = this.stream(streamId);
    return new Promise((resolve) => {
      if (st?.done) resolve(Buffer.concat(st.chunks));
      else st.onDone = () => resolve(Buffer.concat(st.chunks));
    });
  }
}

let cloudly;
before(async () => {
  cloudly = await startScript(here('./cloudly.mjs'), ['--token', 'tok-1', '--cluster-id', 'c-1', '--corestore-endpoint', 'http://127.0.0.1:1', '--quiet']);
  cloudly.pump();
});
after(() => cloudly.proc.kill());

test('the first stdout line announces the port', () => {
  assert.equal(cloudly.first.event, 'listening');
  assert.ok(cloudly.first.port > 0);
});

test('authentication, cluster config, tags and echo answer with the captured envelope shapes', async () => {
  const agent = new RawAgent(cloudly.first.url);
  await agent.opened;
  const bad = await agent.call('getIdentityByToken', { token: 'nope' });
  assert.deepEqual(bad.error, { text: 'invalid token', data: {} });
  assert.equal(bad.response, null);
  const ok = await agent.call('getIdentityByToken', { token: 'tok-1' }, 'id-1');
  assert.deepEqual(Object.keys(ok), ['method', 'request', 'response', 'correlation', 'localData']);
  assert.deepEqual(ok.correlation, { id: 'id-1', phase: 'response' });
  assert.equal(ok.localData, null);
  const { identity } = ok.response;
  assert.equal(identity.type, 'machine');
  assert.equal(identity.role, 'cluster');
  const cfg = await agent.call('getClusterConfig', { identity: { jwt: identity.jwt } });
  assert.equal(cfg.response.configData.id, 'c-1');
  assert.equal(cfg.response.configData.data.nodes[0].data.corestore.endpoint, 'http://127.0.0.1:1');
  assert.deepEqual(cfg.response.services, []);
  const tag = await agent.call('__typedsocket_setTag', { name: 'coreflow', payload: { clusterId: 'c-1' } });
  assert.deepEqual(tag.response, { success: true });
  const echo = await agent.call('echo', { value: 'hi' });
  assert.deepEqual(echo.response, { value: 'hi' });
  const err = await agent.call('failWithError', { text: 'boom', data: { code: 42 } });
  assert.deepEqual(err.error, { text: 'boom', data: { code: 42 } });
  const ev = await cloudly.send({ cmd: 'events' });
  assert.deepEqual(ev.events.connections.at(-1).tags, { coreflow: { clusterId: 'c-1' } });
  agent.ws.close();
  await agent.closed;
});

test('retryOnce answers the first attempt with retry and the resend with attempts 2', async () => {
  const agent = new RawAgent(cloudly.first.url);
  await agent.opened;
  const first = await agent.call('retryOnce', { waitForMs: 5 }, 'r-1');
  assert.deepEqual(first.retry, { waitForMs: 5, reason: 'stand-in Cloudly asks for exactly one retry' });
  assert.equal(first.response, null);
  assert.equal(first.error, undefined);
  const second = await agent.call('retryOnce', { waitForMs: 5 }, 'r-1');
  assert.deepEqual(second.response, { attempts: 2, key: 'r-1', sameCorrelationId: true });
  agent.ws.close();
  await agent.closed;
});

test('fire and stream reach the agent; streamed bytes are SHAKE256(seed) in Buffer form', async () => {
  const agent = new RawAgent(cloudly.first.url);
  await agent.opened;
  await cloudly.send({ cmd: 'wait', for: 'open-connections', count: 1 });
  agent.handlers.ping = async (req) => ({ response: { pong: req.n } });
  const fired = await cloudly.send({ cmd: 'fire', method: 'ping', request: { n: 7 } });
  assert.equal(fired.ok, true);
  assert.deepEqual(fired.response, { pong: 7 });
  const refused = await cloudly.send({ cmd: 'fire', method: 'unknownHere', request: {} });
  assert.deepEqual([refused.ok, refused.errorText], [false, 'no handler']);

  agent.handlers.stage = async (req) => {
    const bytes = await agent.received(req.archive.streamId);
    return { response: { size: bytes.length, sha256: sha(bytes) } };
  };
  const r = await cloudly.send({ cmd: 'stream', method: 'stage', bytes: 700000, seed: 'abc', chunkSize: 262144, request: { path: 'x' } });
  const expected = sha(shake('abc', 700000));
  assert.equal(r.ok, true);
  assert.equal(r.sha256, expected);
  assert.deepEqual(r.response, { size: 700000, sha256: expected });
  assert.equal(r.chunksAcked, 3);
  assert.deepEqual([...agent.streams.get(r.streamId).forms], ['buffer']);
  agent.ws.close();
  await agent.closed;
});

test('uploadStream records the sha256 and length of what the agent sends', async () => {
  const agent = new RawAgent(cloudly.first.url);
  await agent.opened;
  const data = shake('up', 300001);
  const call = agent.call('uploadStream', { archive: { _isVirtualStream: true, streamId: 'up-1' } });
  for (let off = 0; off < data.length; off += 100000) {
    const reply = await agent.streamFrame('up-1', 'chunk', { next: true, backpressure: false, chunkData: { type: 'Buffer', data: [...data.subarray(off, off + 100000)] } });
    assert.equal(reply.request, null);
    assert.equal(reply.response.mainPurpose, 'feedback');
  }
  await agent.streamFrame('up-1', 'chunk', { next: false, backpressure: false, chunkData: CLOSING_BIT });
  const done = await call;
  assert.deepEqual(done.response, { field: 'archive', status: 'complete', bytes: 300001, chunks: 4, sha256: sha(data) });
  const ev = await cloudly.send({ cmd: 'events' });
  const rec = ev.events.streams.find((s) => s.streamId === 'up-1');
  assert.deepEqual(rec.frames.forms, { buffer: 4, 'closing-bit': 1 });
  agent.ws.close();
  await agent.closed;
});

test('a closure the agent backed up is held and served back to its reads, closing bit last', async () => {
  const agent = new RawAgent(cloudly.first.url);
  await agent.opened;
  const data = shake('closure', 150001);
  const descriptor = { size: data.length, sha256: sha(data), receipt: { issuer: 'reference-corestore', mac: 'm' } };
  const request = { backupId: 'b-9', serviceId: 's-9', nodeId: 'n-1', descriptor };
  const accepted = await agent.call('backupServiceDatabaseClosure', { ...request, closure: { _isVirtualStream: true, streamId: 'cl-1' } });
  assert.deepEqual(accepted.response, { accepted: true });
  await agent.streamFrame('cl-1', 'chunk', { next: true, backpressure: false, chunkData: { type: 'Buffer', data: [...data] } });
  await agent.streamFrame('cl-1', 'chunk', { next: false, backpressure: false, chunkData: CLOSING_BIT });
  await cloudly.send({ cmd: 'wait', for: 'streams', count: 1 });
  assert.deepEqual((await cloudly.send({ cmd: 'serve-closures', on: true })).serving, true);
  try {
    const answer = await agent.call('restoreServiceDatabaseClosure', { backupId: 'b-9', serviceId: 's-9', nodeId: 'n-1' });
    assert.deepEqual(answer.response.descriptor, descriptor);
    const { streamId } = answer.response.closure;
    assert.deepEqual(answer.response.closure, { _isVirtualStream: true, streamId });
    const pieces = [];
    for (;;) {
      const reply = await agent.streamFrame(streamId, 'read', { next: false, backpressure: false });
      assert.equal(reply.response.mainPurpose, 'chunk');
      if (reply.response.chunkData === CLOSING_BIT) {
        assert.equal(reply.response.next, false);
        break;
      }
      assert.equal(reply.response.next, true);
      pieces.push(Buffer.from(reply.response.chunkData.data));
    }
    assert.equal(sha(Buffer.concat(pieces)), sha(data));
    assert.equal(pieces.length, 3); // 64 KiB each, the last one short
    const after = await agent.streamFrame(streamId, 'read', { next: false, backpressure: false });
    assert.deepEqual([after.response.mainPurpose, after.response.next], ['feedback', false]);
    const farewell = await agent.streamFrame(streamId, 'keepAlive', { keepAlive: false });
    assert.equal(farewell.response.keepAlive, false);
    const ev = await cloudly.send({ cmd: 'wait', for: 'closure-serves', count: 1 });
    const served = ev.events.closureServes.find((c) => c.streamId === streamId);
    assert.deepEqual([served.source, served.bytes, served.status], ['backup', data.length, 'served']);
  } finally {
    await cloudly.send({ cmd: 'serve-closures', on: false });
    agent.ws.close();
    await agent.closed;
  }
});

test('fire-chain fires each call once the last settled, writing and observing a file', async () => {
  const agent = new RawAgent(cloudly.first.url);
  await agent.opened;
  await cloudly.send({ cmd: 'wait', for: 'open-connections', count: 1 });
  const seen = [];
  agent.handlers.step = async (req) => {
    seen.push(req.n);
    return req.n === 2 ? { error: { text: 'no', data: { code: 'refused' } } } : { response: { n: req.n } };
  };
  const path = here(`./.selftest-chain-${process.pid}`);
  try {
    const chain = await cloudly.send({
      cmd: 'fire-chain',
      calls: [1, 2, 3].map((n) => ({ method: 'step', request: { n }, write: { path, seed: `w${n}`, bytes: 10 } })),
      observe: path,
    });
    assert.deepEqual(seen, [1, 2, 3]);
    const [one, two, three] = chain.results;
    assert.deepEqual([one.ok, one.response], [true, { n: 1 }]);
    assert.deepEqual([two.ok, two.errorText, two.errorData], [false, 'no', { code: 'refused' }]);
    assert.deepEqual([three.ok, three.response], [true, { n: 3 }]);
    for (const [n, r] of [[1, one], [2, two], [3, three]]) {
      assert.equal(r.wrote, sha(shake(`w${n}`, 10)));
      assert.equal(r.observed, r.wrote);
    }
    assert.ok(two.sentAt >= one.settledAt && three.sentAt >= two.settledAt);
  } finally {
    rmSync(path, { force: true });
    agent.ws.close();
    await agent.closed;
  }
});

test('restart closes clients and listens again on the same port', async () => {
  const agent = new RawAgent(cloudly.first.url);
  await agent.opened;
  const r = await cloudly.send({ cmd: 'restart' });
  assert.equal(r.port, cloudly.first.port);
  await agent.closed;
  const again = new RawAgent(cloudly.first.url);
  await again.opened;
  again.ws.close();
  await again.closed;
});

test('bench responder reports bytes and sha256 per stream', async () => {
  const bench = await startScript(here('../../bench/node_responder.mjs'), []);
  try {
    const agent = new RawAgent(bench.first.url);
    await agent.opened;
    const data = shake(9, 200000);
    const call = agent.call('benchUpload', { archive: { _isVirtualStream: true, streamId: 'b-1' } });
    await agent.streamFrame('b-1', 'chunk', { next: false, backpressure: false, chunkData: { type: 'Buffer', data: [...data] } });
    await agent.streamFrame('b-1', 'chunk', { next: false, backpressure: false, chunkData: CLOSING_BIT });
    const done = await call;
    assert.equal(done.response.sha256, sha(data));
    const line = await bench.next();
    assert.deepEqual([line.event, line.bytes, line.sha256, line.status], ['stream', 200000, sha(data), 'complete']);
    agent.ws.close();
    await agent.closed;
  } finally {
    bench.proc.kill();
  }
});
