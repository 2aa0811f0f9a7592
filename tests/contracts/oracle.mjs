// The seeds' own TypeScript, transcribed to JavaScript, run by Node as the test oracle.
//
// `validateClusterNodeCorestore` is seed 001 (ts/data/clusternode.ts) with the type annotations
// removed; `readPartialRestoreResourceTypes` is seed 002 (dist_ts/data/backup.js) verbatim.
// Nothing else is changed: the point is that Node's own `URL` answers.
//
// Protocol: one JSON request per stdin line, one JSON answer per stdout line.
//   {"fn": "corestore", "value": <any>, "path"?: <string>}  -> {"ok": [<message>...]}
//   {"fn": "partial", "backup": <any>}                      -> {"ok": [<type>...]}
// A thrown exception answers {"threw": "<name>"}.

import { createInterface } from 'node:readline';

const maximumClusterNodeCorestoreEndpointLength = 2048;

export const validateClusterNodeCorestore = (
  valueArg,
  pathArg = 'cluster node corestore',
) => {
  if (!valueArg
    || typeof valueArg !== 'object'
    || Array.isArray(valueArg)
    || (Object.getPrototypeOf(valueArg) !== Object.prototype
      && Object.getPrototypeOf(valueArg) !== null)
    || Object.keys(valueArg).join(',') !== 'endpoint') {
    return [`${pathArg} must use its exact schema`];
  }
  const endpoint = valueArg.endpoint;
  if (typeof endpoint !== 'string'
    || endpoint.length === 0
    || endpoint.length > maximumClusterNodeCorestoreEndpointLength) {
    return [`${pathArg} endpoint must be a string of 1 to `
      + `${maximumClusterNodeCorestoreEndpointLength} characters`];
  }
  let parsedEndpoint;
  try {
    parsedEndpoint = new URL(endpoint);
  } catch {
    return [`${pathArg} endpoint must be a parsable URL`];
  }
  const errors = [];
  if (parsedEndpoint.protocol !== 'http:' && parsedEndpoint.protocol !== 'https:') {
    errors.push(`${pathArg} endpoint must use the http or https scheme`);
  }
  if (parsedEndpoint.username || parsedEndpoint.password) {
    errors.push(`${pathArg} endpoint must not carry userinfo`);
  }
  if (parsedEndpoint.origin !== endpoint) {
    errors.push(
      `${pathArg} endpoint must be the canonical origin ${parsedEndpoint.origin}, `
        + 'without a path, query, fragment, trailing slash or default port',
    );
  }
  return errors;
};

export const readPartialRestoreResourceTypes = (backupArg) => {
  const failure = backupArg.failure;
  if (backupArg.status !== 'failed' || failure?.kind !== 'incomplete')
    return [];
  const uncapturedTypes = new Set(failure.uncaptured.map((resourceArg) => resourceArg.type));
  return ['database', 'objectstorage'].filter((typeArg) => (!uncapturedTypes.has(typeArg) && backupArg.snapshots.some((snapshotArg) => snapshotArg.type === typeArg)));
};

const answer = (request) => {
  try {
    if (request.fn === 'corestore') {
      const ok = 'path' in request
        ? validateClusterNodeCorestore(request.value, request.path)
        : validateClusterNodeCorestore(request.value);
      return { ok };
    }
    if (request.fn === 'partial') {
      return { ok: readPartialRestoreResourceTypes(request.backup) };
    }
    return { threw: 'UnknownFunction' };
  } catch (error) {
    return { threw: error?.constructor?.name ?? 'unknown' };
  }
};

const lines = createInterface({ input: process.stdin, crlfDelay: Infinity });
for await (const line of lines) {
  if (line.trim() === '') continue;
  process.stdout.write(`${JSON.stringify(answer(JSON.parse(line)))}\n`);
}
