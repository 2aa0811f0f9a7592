#!/usr/bin/env node
// Reference JS responder for the VirtualStream benchmark, on the REAL @api.global/typedrequest
// 3.3.0 (installed by `npm ci` in tests/interop; the glue lives in tests/interop/lib).
//
//   node bench/node_responder.mjs [--port N] [--host 127.0.0.1] [--method benchUpload] [--verbose]
//
// A `ws` server whose per-connection TypedRouter serves `<method>` (default `benchUpload`): the
// request carries a VirtualStream in any top-level field (usually `archive`); the library's
// responder side receives it, this script hashes what arrives. stdout, one JSON object a line:
//   {"event":"listening","port":N,"host":..,"url":..}                       once, first
//   {"event":"stream","conn":..,"streamId":..,"field":..,"status":"complete"|"broken"|"bad-chunk",
//    "bytes":..,"chunks":..,"sha256":..,"seconds":..,"secondsSinceRequest":..,"mbPerSec":..}
//                                                                           per stream, at its end
// The outer call is answered when the stream ends with {field,status,bytes,chunks,sha256,seconds},
// or at once with {accepted:true,streamId} when the request has `replyWhen: "start"`.
// `seconds` runs from the arrival of the first chunk frame (after its JSON.parse) to the moment
// the closing bit is read; `secondsSinceRequest` from the outer request's arrival. Library logs are dropped
// unless --verbose (then they go to stderr). Runs until SIGTERM/SIGINT.

import { createServer } from 'node:http';
import { parseArgs } from 'node:util';
// bare specifiers do not resolve from bench/, so everything comes through tests/interop/lib
import { SocketPeer, TypedHandler, TypedResponseError, WebSocketServer } from '../tests/interop/lib/wsglue.mjs';
import { drainStream, streamFields } from '../tests/interop/lib/streams.mjs';
import { emit, redirectConsole } from '../tests/interop/lib/control.mjs';

const { values: args } = parseArgs({
  options: {
    host: { type: 'string', default: '127.0.0.1' },
    port: { type: 'string', default: '0' },
    method: { type: 'string', default: 'benchUpload' },
    deflate: { type: 'boolean', default: false },
    verbose: { type: 'boolean', default: false },
  },
});
const log = redirectConsole({ quiet: !args.verbose });

let nextConnId = 1;
const firstChunkAt = new Map(); // streamId -> hrtime of the first chunk frame (after its JSON.parse)

function onFrame(dir, frame) {
  const req = frame?.request;
  if (dir === 'in' && frame.method === '##VirtualStream##' && req?.mainPurpose === 'chunk' && !firstChunkAt.has(req.streamId)) {
    firstChunkAt.set(req.streamId, process.hrtime.bigint());
  }
}

function install(router, peer) {
  router.addTypedHandler(
    new TypedHandler(args.method, async (request) => {
      const found = streamFields(request);
      if (found.length !== 1) {
        throw new TypedResponseError('expected exactly one VirtualStream field', { found: found.length });
      }
      const { field, stream } = found[0];
      const record = { field, streamId: stream.streamId };
      const done = drainStream(stream, record, peer.closedPromise).then((r) => {
        const first = firstChunkAt.get(r.streamId);
        firstChunkAt.delete(r.streamId);
        r.secondsSinceRequest = r.seconds;
        r.seconds = first === undefined ? 0 : Number(process.hrtime.bigint() - first) / 1e9;
        emit({ event: 'stream', conn: peer.id, ...r, mbPerSec: r.seconds > 0 ? r.bytes / 1e6 / r.seconds : null });
        return r;
      });
      if (request.replyWhen === 'start') return { accepted: true, streamId: stream.streamId };
      const r = await done;
      const { field: f, status, bytes, chunks, sha256, seconds, secondsSinceRequest } = r;
      return { field: f, status, bytes, chunks, sha256, seconds, secondsSinceRequest };
    }),
  );
}

const wss = new WebSocketServer({ noServer: true, perMessageDeflate: args.deflate, maxPayload: 512 * 1024 * 1024 });
const server = createServer((req, res) => {
  res.writeHead(426);
  res.end();
});
server.on('upgrade', (req, socket, head) =>
  wss.handleUpgrade(req, socket, head, (ws) => new SocketPeer(ws, { id: nextConnId++, install, onFrame, log })),
);
server.listen(Number(args.port), args.host, () => {
  const { port } = server.address();
  emit({ event: 'listening', port, host: args.host, url: `ws://${args.host}:${port}/` });
});
const stop = () => {
  for (const ws of wss.clients) ws.terminate();
  server.close(() => process.exit(0));
  server.closeAllConnections();
};
process.on('SIGTERM', stop);
process.on('SIGINT', stop);
